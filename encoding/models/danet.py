"""DANet (Fu et al., "Dual Attention Network for Scene Segmentation", CVPR 2019)."""
from __future__ import annotations

from typing import Sequence

from torch import nn

from ..nn.customize import DANetHead, NormLayer
from .base import SegmentationModel

__all__ = ["DANet", "danet_head"]


class DANet(SegmentationModel):
    """Dual attention network: backbone → :class:`~encoding.nn.DANetHead` (position + channel attention) on ``c4``.
    See :class:`SegmentationModel` for the arguments and the output dict."""


def danet_head(channels: Sequence[int], nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
               output_stride: int = 8) -> nn.Module:
    """The DANet head for backbone stage ``channels`` (uses ``c4``)."""
    return DANetHead(channels[3], nclass, norm_layer)
