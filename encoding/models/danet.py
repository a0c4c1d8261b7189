"""DANet (Fu et al., "Dual Attention Network for Scene Segmentation", CVPR 2019)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.blocks import NormLayer, conv_norm_act
from .base import FeatureInfo, SegmentationModel
from .registry import register_architecture

__all__ = ["PAM", "CAM", "DANetHead", "DANet", "danet_head"]


class PAM(nn.Module):
    """Position attention module (DANet): every position attends to every other position.

    ``out = gamma * V softmax(Qᵀ K)ᵀ + x`` with 1x1-conv projections ``Q, K`` (``C // reduction`` channels) and
    ``V`` (``C`` channels) and a learnable scalar ``gamma`` initialised to 0. Computed with
    ``scaled_dot_product_attention`` (scale 1), so memory-efficient kernels are used where available.

    Shape:
        - Input: ``B x C x H x W``.
        - Output: ``B x C x H x W``.
    """

    def __init__(self, in_channels: int, reduction: int = 8) -> None:
        super().__init__()
        inter = max(in_channels // reduction, 1)
        self.query_conv = nn.Conv2d(in_channels, inter, 1)
        self.key_conv = nn.Conv2d(in_channels, inter, 1)
        self.value_conv = nn.Conv2d(in_channels, in_channels, 1)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        query = self.query_conv(x).flatten(2).transpose(1, 2).unsqueeze(1)  # B x 1 x N x C'
        key = self.key_conv(x).flatten(2).transpose(1, 2).unsqueeze(1)
        value = self.value_conv(x).flatten(2).transpose(1, 2).unsqueeze(1)  # B x 1 x N x C
        out = F.scaled_dot_product_attention(query, key, value, scale=1.0)
        return self.gamma * out.squeeze(1).transpose(1, 2).reshape(b, c, h, w) + x


class CAM(nn.Module):
    """Channel attention module (DANet): every channel attends to every other channel.

    ``energy = X Xᵀ`` (``C x C``), ``attention = softmax(max(energy) - energy)`` (= ``softmax(-energy)``),
    ``out = gamma * attention X + x`` with a learnable scalar ``gamma`` initialised to 0.

    Shape:
        - Input: ``B x C x H x W``.
        - Output: ``B x C x H x W``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor) -> Tensor:
        flat = x.flatten(2)  # B x C x N
        attention = torch.softmax(-(flat @ flat.transpose(1, 2)), dim=-1)
        return self.gamma * (attention @ flat).view_as(x) + x


class DANetHead(nn.Module):
    """DANet head: parallel :class:`PAM` and :class:`CAM` branches (each 3x3 conv → attention → 3x3 conv), summed,
    dropout, 1x1 classifier.

    Only the fused output is produced (every parameter contributes to it, as DDP requires).

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        super().__init__()
        inter = in_channels // 4
        self.position = nn.Sequential(conv_norm_act(in_channels, inter, 3, norm_layer), PAM(inter),
                                      conv_norm_act(inter, inter, 3, norm_layer))
        self.channel = nn.Sequential(conv_norm_act(in_channels, inter, 3, norm_layer), CAM(),
                                     conv_norm_act(inter, inter, 3, norm_layer))
        self.classifier = nn.Sequential(nn.Dropout2d(0.1), nn.Conv2d(inter, out_channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.position(x) + self.channel(x))


class DANet(SegmentationModel):
    """Dual attention network: backbone → :class:`DANetHead` (position + channel attention) on ``c4``. See
    :class:`SegmentationModel` for the arguments and the output dict."""


@register_architecture("danet", DANet)
def danet_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d) -> nn.Module:
    """The DANet head for the backbone ``features`` (uses ``c4``)."""
    return DANetHead(features.channels[3], nclass, norm_layer)
