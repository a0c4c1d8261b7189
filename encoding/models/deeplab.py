"""DeepLabV3 (Chen et al., 2017): atrous spatial pyramid pooling on a dilated backbone.

With a ResNet-50/101 backbone, output stride 8 and ``aux=True`` this is torchvision's ``deeplabv3_resnet50/101``
module for module (same parameters, same state-dict keys, same outputs).
"""
from __future__ import annotations

from typing import Optional, Sequence

from torch import nn

from ..nn.customize import DeepLabV3Head, NormLayer
from .base import SegmentationModel

__all__ = ["DeepLabV3", "deeplab_head"]


class DeepLabV3(SegmentationModel):
    """DeepLabV3: backbone → :class:`~encoding.nn.DeepLabV3Head` (ASPP) on ``c4``. See :class:`SegmentationModel`
    for the arguments and the output dict."""


def deeplab_head(channels: Sequence[int], nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
                 output_stride: int = 8, atrous_rates: Optional[Sequence[int]] = None) -> nn.Module:
    """The DeepLabV3 head for backbone stage ``channels`` (uses ``c4``).

    Args:
        atrous_rates: ASPP dilations; default (12, 24, 36) at output stride 8, scaled for other strides
            ((6, 12, 18) at 16).
    """
    if atrous_rates is None:
        atrous_rates = tuple(r * 8 // output_stride for r in (12, 24, 36))
    return DeepLabV3Head(channels[3], nclass, atrous_rates, norm_layer)
