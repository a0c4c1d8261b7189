"""U-Net (Ronneberger et al., MICCAI 2015): a decoder that climbs back from the coarsest backbone stage, fusing every
finer stage through a skip connection, as segmentation_models_pytorch's ``Unet`` and mmsegmentation's ``UNet`` do.

With the ``vgg_tiny`` backbone (stages at strides 2 ... 8) it is the default model of the embedded ``shapes`` recipe:
light enough to learn the shapes from scratch in a few CPU minutes, with logits at stride 2 so that thin bars and star
tips keep their outline.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from ..nn.blocks import NormLayer, conv_norm_act, resize
from .base import FeatureInfo, SegmentationModel
from .registry import register_architecture

__all__ = ["UNetHead", "UNet", "unet_head"]


class UNetHead(nn.Module):
    """U-Net decoder: from ``c4`` down to ``c1``, each level upsamples the previous one to the next finer stage,
    concatenates that stage and fuses them with a 3x3 conv → norm → ReLU; a 1x1 conv gives the logits.

    Args:
        in_channels: channels of every stage, finest first (``c1, c2, c3, c4``).
        out_channels: number of classes.
        norm_layer: normalization layer class.
        decoder_channels: output channels of the decoder levels, finest first (one per stage but the last);
            default: those of the stage each level fuses.

    Shape:
        - Input: ``*features`` (``c1..c4``) with ``in_channels`` channels.
        - Output: ``B x out_channels x H1 x W1`` (``H1 x W1`` the size of ``c1``).
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d,
                 decoder_channels: Optional[Sequence[int]] = None) -> None:
        super().__init__()
        widths = tuple(decoder_channels or in_channels[:-1])
        if len(widths) != len(in_channels) - 1:
            raise ValueError(f"decoder_channels needs {len(in_channels) - 1} values (one per stage but the last), "
                             f"got {len(widths)}")
        coarser = (*widths[1:], in_channels[-1])
        self.fuse = nn.ModuleList(conv_norm_act(c + skip, w, 3, norm_layer)
                                  for w, skip, c in zip(widths, in_channels, coarser))
        self.classifier = nn.Conv2d(widths[0], out_channels, 1)

    def forward(self, *features: Tensor) -> Tensor:
        if len(features) != len(self.fuse) + 1:
            raise ValueError(f"UNetHead expects {len(self.fuse) + 1} feature maps, got {len(features)}")
        x = features[-1]
        for level in reversed(range(len(self.fuse))):
            skip = features[level]
            x = self.fuse[level](torch.cat([resize(x, skip.shape[-2:]), skip], dim=1))
        return self.classifier(x)


class UNet(SegmentationModel):
    """U-Net: backbone → :class:`UNetHead` over ``c1..c4``, logits at the stride of ``c1``.
    See :class:`SegmentationModel` for the arguments and the output dict."""

    head_inputs = (0, 1, 2, 3)


@register_architecture("unet", UNet, output_stride=16, title="U-Net")
def unet_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
              decoder_channels: Optional[Sequence[int]] = None) -> nn.Module:
    """The U-Net decoder for the backbone ``features`` (uses ``c1..c4``).

    Args:
        decoder_channels: output channels of the three decoder levels, finest first (default: those of
            ``c1, c2, c3``).
    """
    return UNetHead(features.channels, nclass, norm_layer, decoder_channels)
