"""FCN (Long et al., 2015) on a dilated backbone: :class:`FCNHead` on the last stage.

With a ResNet-50/101 backbone, output stride 8 and ``aux=True`` this is torchvision's ``fcn_resnet50/101`` module for
module (same parameters, same state-dict keys, same outputs). :class:`FCNHead` is also every model's auxiliary head.
"""
from __future__ import annotations

from torch import nn

from ..nn.blocks import NormLayer, conv_norm_act
from .base import FeatureInfo, SegmentationModel
from .factory import variant
from .registry import register_architecture

__all__ = ["FCNHead", "FCN", "fcn_head", "get_fcn"]


class FCNHead(nn.Sequential):
    """FCN head: 3x3 conv to ``in_channels // 4``, norm, ReLU, dropout, 1x1 conv to the classes.

    Same layout (and state-dict keys ``0.weight``, ``1.*``, ``4.*``) as torchvision's ``FCNHead``. Also used as the
    auxiliary head of every model.

    Args:
        in_channels: channels of the input feature map.
        out_channels: number of classes.
        norm_layer: normalization layer class.
        dropout: dropout probability before the classifier.

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d,
                 dropout: float = 0.1) -> None:
        inter = in_channels // 4
        super().__init__(*conv_norm_act(in_channels, inter, 3, norm_layer), nn.Dropout(dropout),
                         nn.Conv2d(inter, out_channels, 1))


class FCN(SegmentationModel):
    """Fully convolutional network: backbone → :class:`FCNHead` on ``c4``. See :class:`SegmentationModel` for the
    arguments and the output dict."""


@register_architecture("fcn", FCN)
def fcn_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d) -> nn.Module:
    """The FCN head for the backbone ``features`` (uses ``c4``)."""
    return FCNHead(features.channels[3], nclass, norm_layer)


get_fcn = variant("fcn", "FCN")
