"""PSPNet (Zhao et al., CVPR 2017): pyramid pooling over the last stage of a dilated backbone."""
from __future__ import annotations

from torch import nn

from ..nn.blocks import NormLayer, conv_norm_act
from .base import FeatureInfo, SegmentationModel
from .heads import PyramidPooling
from .registry import register_architecture

__all__ = ["PSPHead", "PSP", "psp_head"]


class PSPHead(nn.Sequential):
    """PSPNet head: :class:`PyramidPooling`, 3x3 conv to ``in_channels // 4``, norm, ReLU, dropout, 1x1 classifier.

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        pool = PyramidPooling(in_channels, norm_layer)
        inter = in_channels // 4
        super().__init__(pool, *conv_norm_act(pool.out_channels, inter, 3, norm_layer), nn.Dropout(0.1),
                         nn.Conv2d(inter, out_channels, 1))


class PSP(SegmentationModel):
    """Pyramid scene parsing network: backbone → :class:`PSPHead` on ``c4``. See :class:`SegmentationModel` for the
    arguments and the output dict."""


@register_architecture("psp", PSP, title="PSPNet")
def psp_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d) -> nn.Module:
    """The PSP head for the backbone ``features`` (uses ``c4``)."""
    return PSPHead(features.channels[3], nclass, norm_layer)
