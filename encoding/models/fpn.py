"""Feature-pyramid models on a non-dilated backbone: FCFPN and UperNet (Xiao et al., ECCV 2018)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor, nn

from ..nn.blocks import NormLayer, conv_norm_act, resize
from .base import FeatureInfo, SegmentationModel
from .heads import PyramidPooling
from .registry import register_architecture

__all__ = ["FPNHead", "FCFPN", "UperNet", "upernet_head", "fcfpn_head"]


class FPNHead(nn.Module):
    """Feature-pyramid head over all backbone stages: FCFPN, or UperNet with ``pyramid_pooling=True``.

    The top (c4) is reduced to ``fpn_dim`` by a 3x3 conv (preceded by :class:`PyramidPooling` for UperNet); going
    down, each level adds its 1x1 lateral projection to the upsampled coarser level and is refined by a 3x3 conv;
    all levels are upsampled to c1's size, concatenated and classified (3x3 conv to ``fuse_channels``, dropout, 1x1).

    Args:
        in_channels: channels of every stage, finest first (c1, c2, c3, c4).
        out_channels: number of classes.
        norm_layer: normalization layer class.
        fpn_dim: channels of the pyramid levels.
        pyramid_pooling: put :class:`PyramidPooling` on the top level (UperNet).
        fuse_channels: output channels of the 3x3 conv that fuses the concatenated levels at stride 4 (512 in
            PyTorch-Encoding; this conv is most of the head's operations: 256 halves them, as
            segmentation_models_pytorch's ``UPerNet``).
        pool_channels: channels of each pyramid-pooling branch (default c4's channels / 4, PyTorch-Encoding's;
            segmentation_models_pytorch's ``UPerNet``: 256, which also narrows the top 3x3 conv: 4.4 M fewer
            parameters on ResNet-50, at stride 32 where they cost few operations but weigh in every step).

    Shape:
        - Input: ``*features`` (c1..c4) with ``in_channels`` channels.
        - Output: ``B x out_channels x H1 x W1`` (``H1 x W1`` the size of c1).
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d,
                 fpn_dim: int = 256, pyramid_pooling: bool = False, fuse_channels: int = 512,
                 pool_channels: Optional[int] = None) -> None:
        super().__init__()
        if pyramid_pooling:
            pool = PyramidPooling(in_channels[-1], norm_layer, branch_channels=pool_channels)
            self.top = nn.Sequential(pool, *conv_norm_act(pool.out_channels, fpn_dim, 3, norm_layer))
        else:
            self.top = conv_norm_act(in_channels[-1], fpn_dim, 3, norm_layer)
        self.laterals = nn.ModuleList(conv_norm_act(c, fpn_dim, 1, norm_layer) for c in in_channels[:-1])
        self.refine = nn.ModuleList(conv_norm_act(fpn_dim, fpn_dim, 3, norm_layer) for _ in in_channels[:-1])
        self.fuse = nn.Sequential(*conv_norm_act(len(in_channels) * fpn_dim, fuse_channels, 3, norm_layer),
                                  nn.Dropout(0.1), nn.Conv2d(fuse_channels, out_channels, 1))

    def forward(self, *features: Tensor) -> Tensor:
        if len(features) != len(self.laterals) + 1:
            raise ValueError(f"FPNHead expects {len(self.laterals) + 1} feature maps, got {len(features)}")
        size = features[0].shape[-2:]
        feat = self.top(features[-1])
        levels = [resize(feat, size)]
        for i in reversed(range(len(self.laterals))):
            lateral = self.laterals[i](features[i])
            feat = resize(feat, lateral.shape[-2:]) + lateral
            levels.append(resize(self.refine[i](feat), size))
        return self.fuse(torch.cat(levels, dim=1))


class FCFPN(SegmentationModel):
    """Fully convolutional FPN: backbone → :class:`FPNHead` over ``c1..c4``, logits at stride 4.
    See :class:`SegmentationModel` for the arguments and the output dict."""

    head_inputs = (0, 1, 2, 3)


class UperNet(FCFPN):
    """Unified perceptual parsing network: FCFPN with pyramid pooling on the top level."""


@register_architecture("upernet", UperNet, output_stride=32)
def upernet_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
                 fpn_dim: int = 256, fuse_channels: int = 512, pool_channels: Optional[int] = None) -> nn.Module:
    """The UperNet head for the backbone ``features`` (uses ``c1..c4``, pyramid pooling on ``c4``); ``fpn_dim``,
    ``fuse_channels`` and ``pool_channels`` as in :class:`FPNHead`."""
    return FPNHead(features.channels, nclass, norm_layer, fpn_dim=fpn_dim, pyramid_pooling=True,
                   fuse_channels=fuse_channels, pool_channels=pool_channels)


@register_architecture("fcfpn", FCFPN, output_stride=32)
def fcfpn_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
               fpn_dim: int = 256, fuse_channels: int = 512) -> nn.Module:
    """The FCFPN head for the backbone ``features`` (uses ``c1..c4``); ``fpn_dim`` and ``fuse_channels`` as in
    :class:`FPNHead`."""
    return FPNHead(features.channels, nclass, norm_layer, fpn_dim=fpn_dim, fuse_channels=fuse_channels)
