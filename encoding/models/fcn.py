"""FCN (Long et al., 2015) on a dilated backbone: an :class:`~encoding.nn.FCNHead` on the last stage.

With a ResNet-50/101 backbone, output stride 8 and ``aux=True`` this is torchvision's ``fcn_resnet50/101`` module for
module (same parameters, same state-dict keys, same outputs).
"""
from __future__ import annotations

from typing import Sequence

from torch import nn

from ..nn.customize import FCNHead, NormLayer
from .base import SegmentationModel

__all__ = ["FCN", "fcn_head"]


class FCN(SegmentationModel):
    """Fully convolutional network: backbone → :class:`~encoding.nn.FCNHead` on ``c4``. See
    :class:`SegmentationModel` for the arguments and the output dict."""


def fcn_head(channels: Sequence[int], nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
             output_stride: int = 8) -> nn.Module:
    """The FCN head for backbone stage ``channels`` (uses ``c4``)."""
    return FCNHead(channels[3], nclass, norm_layer)
