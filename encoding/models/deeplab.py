"""DeepLabV3 (Chen et al., 2017): atrous spatial pyramid pooling on a dilated backbone; and DeepLabV3+
(Chen et al., ECCV 2018): the same ASPP with a decoder that refines it with stride-4 features.

With a ResNet-50/101 backbone, output stride 8 and ``aux=True`` this is torchvision's ``deeplabv3_resnet50/101``
module for module (same parameters, same state-dict keys, same outputs): :class:`ASPP` and :class:`DeepLabV3Head`
have the layout of torchvision's ``ASPP`` / ``DeepLabHead``. :class:`DeepLabV3Plus` (``deeplabv3plus``, output
stride 16 by default, as in the paper) pairs with the light MobileNetV3 backbones for fast segmentation.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from ..nn.blocks import NormLayer, SeparableConv2d, conv_norm_act, resize
from .base import FeatureInfo, SegmentationModel
from .registry import register_architecture

__all__ = ["ASPP", "DeepLabV3Head", "DeepLabV3", "deeplab_head", "DeepLabV3PlusHead",
           "DeepLabV3Plus", "deeplabv3plus_head"]


class _ImagePooling(nn.Sequential):
    """ASPP image-level branch: global average pool, 1x1 conv, norm, ReLU, upsampled back to the input size
    (bilinear like torchvision, so outputs match it bit for bit)."""

    def __init__(self, in_channels: int, out_channels: int, norm_layer: NormLayer) -> None:
        super().__init__(nn.AdaptiveAvgPool2d(1), *conv_norm_act(in_channels, out_channels, 1, norm_layer))

    def forward(self, x: Tensor) -> Tensor:
        return resize(super().forward(x), x.shape[-2:])


def _conv3x3(in_channels: int, out_channels: int, norm_layer: NormLayer, dilation: int = 1,
            separable: bool = False) -> nn.Sequential:
    """A 3x3 conv → norm → ReLU; with ``separable`` the conv is depthwise-separable (DeepLabV3+'s "atrous separable
    convolution": depthwise 3x3 → norm → pointwise 1x1), about ``1 / 9`` of the parameters and operations."""
    if not separable:
        return conv_norm_act(in_channels, out_channels, 3, norm_layer, dilation=dilation)
    return nn.Sequential(SeparableConv2d(in_channels, out_channels, 3, dilation=dilation, norm_layer=norm_layer),
                         norm_layer(out_channels), nn.ReLU(inplace=True))


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling (DeepLabV3): a 1x1 branch, one 3x3 branch per rate, image pooling, projection.

    Same layout as torchvision's ``ASPP`` (``convs``: 1x1, the atrous branches, pooling; ``project``: 1x1 conv,
    norm, ReLU, dropout 0.5).

    Args:
        in_channels: channels of the input.
        atrous_rates: dilation of each 3x3 branch ((12, 24, 36) at output stride 8).
        out_channels: channels of every branch and of the output.
        norm_layer: normalization layer class.
        separable: depthwise-separable atrous branches (DeepLabV3+'s option).

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, atrous_rates: Sequence[int] = (12, 24, 36), out_channels: int = 256,
                 norm_layer: NormLayer = nn.BatchNorm2d, separable: bool = False) -> None:
        super().__init__()
        branches = [conv_norm_act(in_channels, out_channels, 1, norm_layer)]
        branches += [_conv3x3(in_channels, out_channels, norm_layer, r, separable) for r in atrous_rates]
        branches.append(_ImagePooling(in_channels, out_channels, norm_layer))
        self.convs = nn.ModuleList(branches)
        self.project = nn.Sequential(*conv_norm_act(len(branches) * out_channels, out_channels, 1, norm_layer),
                                     nn.Dropout(0.5))

    def forward(self, x: Tensor) -> Tensor:
        return self.project(torch.cat([branch(x) for branch in self.convs], dim=1))


class DeepLabV3Head(nn.Sequential):
    """DeepLabV3 head: :class:`ASPP` (256 channels), 3x3 conv, norm, ReLU, 1x1 classifier.

    Same layout as torchvision's ``DeepLabHead``.

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, out_channels: int, atrous_rates: Sequence[int] = (12, 24, 36),
                 norm_layer: NormLayer = nn.BatchNorm2d, channels: int = 256) -> None:
        super().__init__(ASPP(in_channels, atrous_rates, channels, norm_layer),
                         *conv_norm_act(channels, channels, 3, norm_layer), nn.Conv2d(channels, out_channels, 1))


class DeepLabV3(SegmentationModel):
    """DeepLabV3: backbone → :class:`DeepLabV3Head` (ASPP) on ``c4``. See :class:`SegmentationModel` for the
    arguments and the output dict."""


@register_architecture("deeplab", DeepLabV3)
def deeplab_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
                 atrous_rates: Optional[Sequence[int]] = None, channels: int = 256) -> nn.Module:
    """The DeepLabV3 head for the backbone ``features`` (uses ``c4``).

    Args:
        atrous_rates: ASPP dilations; default (12, 24, 36) at output stride 8, scaled for other strides
            ((6, 12, 18) at 16).
        channels: channels of the ASPP and of the head (256 in the paper and in torchvision).
    """
    return DeepLabV3Head(features.channels[3], nclass, _atrous_rates(features, atrous_rates), norm_layer, channels)


def _atrous_rates(features: FeatureInfo, atrous_rates: Optional[Sequence[int]]) -> Sequence[int]:
    """The given ASPP rates, or (12, 24, 36) scaled to the output stride ((6, 12, 18) at 16)."""
    if atrous_rates is not None:
        return atrous_rates
    return tuple(r * 8 // features.output_stride for r in (12, 24, 36))


class DeepLabV3PlusHead(nn.Module):
    """DeepLabV3+ head: :class:`ASPP` on ``c4``, upsampled to ``c1`` and concatenated with ``c1`` projected to
    ``low_channels`` by a 1x1 conv, then two 3x3 convs and a 1x1 classifier (logits at stride 4).

    Args:
        in_channels: channels of ``c4``.
        low_level_channels: channels of ``c1``.
        out_channels: number of classes.
        atrous_rates: ASPP dilations.
        norm_layer: normalization layer class.
        channels: channels of the ASPP and of the decoder convs.
        low_channels: channels of the projected ``c1`` (48 in the paper).
        separable: depthwise-separable 3x3 convs in the ASPP and the decoder (the paper's "atrous separable
            convolution", as segmentation_models_pytorch's ``DeepLabV3Plus``): about half the operations of the
            head at the same widths.

    Shape:
        - Input: ``c1`` (``B x low_level_channels x H1 x W1``) and ``c4`` (``B x in_channels x H4 x W4``).
        - Output: ``B x out_channels x H1 x W1``.
    """

    def __init__(self, in_channels: int, low_level_channels: int, out_channels: int,
                 atrous_rates: Sequence[int] = (6, 12, 18), norm_layer: NormLayer = nn.BatchNorm2d,
                 channels: int = 256, low_channels: int = 48, separable: bool = False) -> None:
        super().__init__()
        self.aspp = ASPP(in_channels, atrous_rates, channels, norm_layer, separable)
        self.project = conv_norm_act(low_level_channels, low_channels, 1, norm_layer)
        self.decoder = nn.Sequential(*_conv3x3(channels + low_channels, channels, norm_layer, separable=separable),
                                     *_conv3x3(channels, channels, norm_layer, separable=separable),
                                     nn.Conv2d(channels, out_channels, 1))

    def forward(self, c1: Tensor, c4: Tensor) -> Tensor:
        context = resize(self.aspp(c4), c1.shape[-2:])
        return self.decoder(torch.cat([context, self.project(c1)], dim=1))


class DeepLabV3Plus(SegmentationModel):
    """DeepLabV3+: backbone → :class:`DeepLabV3PlusHead` on ``c1`` and ``c4``. See :class:`SegmentationModel` for
    the arguments and the output dict."""

    head_inputs = (0, 3)


@register_architecture("deeplabv3plus", DeepLabV3Plus, output_stride=16, title="DeepLabV3+")
def deeplabv3plus_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
                       atrous_rates: Optional[Sequence[int]] = None, channels: int = 256,
                       separable: bool = False) -> nn.Module:
    """The DeepLabV3+ head for the backbone ``features`` (uses ``c1`` and ``c4``).

    Args:
        atrous_rates: ASPP dilations; default (6, 12, 18) at output stride 16, scaled for other strides.
        channels: channels of the ASPP and of the decoder (256 in the paper).
        separable: depthwise-separable 3x3 convs in the ASPP and the decoder (see :class:`DeepLabV3PlusHead`).
    """
    return DeepLabV3PlusHead(features.channels[3], features.channels[0], nclass,
                             _atrous_rates(features, atrous_rates), norm_layer, channels, separable=separable)
