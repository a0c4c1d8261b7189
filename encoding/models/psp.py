"""PSPNet (Zhao et al., CVPR 2017): pyramid pooling over the last stage of a dilated backbone."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from ..nn.blocks import NormLayer, conv_norm_act, resize
from .base import FeatureInfo, SegmentationModel
from .factory import variant
from .registry import register_architecture

__all__ = ["PyramidPooling", "PSPHead", "PSP", "psp_head", "get_psp"]


class PyramidPooling(nn.Module):
    """PSPNet pyramid pooling: average-pool to ``bins`` grids, 1x1 conv, upsample, concatenate with the input.

    Args:
        in_channels: channels of the input.
        norm_layer: normalization layer class.
        bins: output grid sizes of the pooling branches.

    Shape:
        - Input: ``B x C x H x W``.
        - Output: ``B x (C + len(bins) * (C // len(bins))) x H x W`` (``2C`` with the default four bins); the first
          ``C`` channels are the input itself.
    """

    def __init__(self, in_channels: int, norm_layer: NormLayer = nn.BatchNorm2d,
                 bins: Sequence[int] = (1, 2, 3, 6)) -> None:
        super().__init__()
        branch_channels = in_channels // len(bins)
        self.branches = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(b), *conv_norm_act(in_channels, branch_channels, 1, norm_layer))
            for b in bins)
        self.out_channels = in_channels + len(bins) * branch_channels

    def forward(self, x: Tensor) -> Tensor:
        size = x.shape[-2:]
        return torch.cat([x] + [resize(branch(x), size) for branch in self.branches], dim=1)


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


@register_architecture("psp", PSP)
def psp_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d) -> nn.Module:
    """The PSP head for the backbone ``features`` (uses ``c4``)."""
    return PSPHead(features.channels[3], nclass, norm_layer)


get_psp = variant("psp", "PSPNet")
