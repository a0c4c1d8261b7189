"""FCN (Long et al., 2015) on a dilated backbone: :class:`FCNHead` on the last stage.

With a ResNet-50/101 backbone, output stride 8 and ``aux=True`` this is torchvision's ``fcn_resnet50/101`` module for
module (same parameters, same state-dict keys, same outputs). Its head, :class:`~encoding.models.heads.FCNHead`, is
also every model's auxiliary head and lives in ``heads.py``.
"""
from __future__ import annotations

from torch import nn

from ..nn.blocks import NormLayer
from .base import FeatureInfo, SegmentationModel
from .heads import FCNHead
from .registry import register_architecture

__all__ = ["FCN", "fcn_head"]


class FCN(SegmentationModel):
    """Fully convolutional network: backbone → :class:`FCNHead` on ``c4``. See :class:`SegmentationModel` for the
    arguments and the output dict."""


@register_architecture("fcn", FCN)
def fcn_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d) -> nn.Module:
    """The FCN head for the backbone ``features`` (uses ``c4``)."""
    return FCNHead(features.channels[3], nclass, norm_layer)

