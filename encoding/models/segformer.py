"""SegFormer (Xie et al., NeurIPS 2021): the Mix Transformer encoder (:mod:`~encoding.models.mit`, backbones
``mit_b0`` ... ``mit_b5``) and the all-MLP decoder (:class:`SegFormerHead`).

The decoder projects every stage to ``channels`` (256 for B0/B1, 768 for B2-B5, as the paper), upsamples them to
stride 4, concatenates them (coarsest first), fuses them with a 1x1 conv → norm → ReLU and classifies with a 1x1
conv; the logits at stride 4 are upsampled to the input size by :class:`~encoding.models.base.SegmentationModel`.
The decoder also runs on any four-stage backbone (e.g. ``resnet50`` at output stride 32).

Weights from Hugging Face (``nvidia/segformer-b*-finetuned-ade-*``, ``nvidia/mit-b*``) load from a local file through
:func:`~encoding.models.hf_segformer.convert_hf_segformer`; ``pretrained=True`` names the file to download.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from ..nn.blocks import NormLayer, conv_norm_act, resize
from .base import FeatureInfo, SegmentationModel
from .registry import register_architecture

__all__ = ["SegFormerHead", "SegFormer", "segformer_head", "DECODER_CHANNELS"]

#: Backbone -> decoder width (the paper's C); other backbones: 768.
DECODER_CHANNELS = {"mit_b0": 256, "mit_b1": 256}


class SegFormerHead(nn.Module):
    """The all-MLP decoder: per-stage linear projection (a 1x1 conv), upsampling to the finest stage, fusion by a
    1x1 conv → norm → ReLU, dropout, 1x1 classifier.

    Args:
        in_channels: channels of every stage, finest first.
        out_channels: number of classes.
        channels: decoder width.
        norm_layer: normalization layer class of the fusion.
        dropout: dropout probability before the classifier.

    Shape:
        - Input: ``*features`` (``c1..c4``).
        - Output: ``B x out_channels x H1 x W1`` (``H1 x W1`` the size of ``c1``).
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int, channels: int = 256,
                 norm_layer: NormLayer = nn.BatchNorm2d, dropout: float = 0.1) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Conv2d(c, channels, 1) for c in in_channels)
        self.fuse = conv_norm_act(channels * len(in_channels), channels, 1, norm_layer)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Conv2d(channels, out_channels, 1)

    def forward(self, *features: Tensor) -> Tensor:
        if len(features) != len(self.proj):
            raise ValueError(f"SegFormerHead expects {len(self.proj)} feature maps, got {len(features)}")
        size = features[0].shape[-2:]
        levels = [resize(proj(f), size) for proj, f in zip(self.proj, features)]
        return self.classifier(self.dropout(self.fuse(torch.cat(levels[::-1], dim=1))))


class SegFormer(SegmentationModel):
    """SegFormer: backbone → :class:`SegFormerHead` over ``c1..c4``, logits at stride 4.
    See :class:`SegmentationModel` for the arguments and the output dict."""

    head_inputs = (0, 1, 2, 3)


@register_architecture("segformer", SegFormer, output_stride=32, title="SegFormer")
def segformer_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
                   channels: Optional[int] = None) -> nn.Module:
    """The all-MLP decoder for the backbone ``features`` (uses ``c1..c4``).

    Args:
        channels: decoder width (default: 256 for ``mit_b0`` / ``mit_b1``, 768 otherwise).
    """
    width = channels or DECODER_CHANNELS.get(features.backbone, 768)
    return SegFormerHead(features.channels, nclass, width, norm_layer)
