"""PSPNet (Zhao et al., CVPR 2017): pyramid pooling over the last stage of a dilated backbone."""
from __future__ import annotations

from typing import Sequence

from torch import nn

from ..nn.customize import NormLayer, PSPHead
from .base import SegmentationModel

__all__ = ["PSP", "psp_head"]


class PSP(SegmentationModel):
    """Pyramid scene parsing network: backbone → :class:`~encoding.nn.PSPHead` on ``c4``. See
    :class:`SegmentationModel` for the arguments and the output dict."""


def psp_head(channels: Sequence[int], nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
             output_stride: int = 8) -> nn.Module:
    """The PSP head for backbone stage ``channels`` (uses ``c4``)."""
    return PSPHead(channels[3], nclass, norm_layer)
