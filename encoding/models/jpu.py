"""Joint pyramid upsampling (FastFCN, Wu et al., 2019): the neck that replaces dilated convolutions.

``get_segmentation_model(..., jpu=True)`` puts :class:`JPU` between a plain stride-32 backbone and any head.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..nn.blocks import NormLayer, SeparableConv2d, conv_norm_act, positional_up_kwargs, resize

__all__ = ["JPU"]


class JPU(nn.Module):
    """Joint pyramid upsampling (FastFCN): turns the stride-8/16/32 stages of a non-dilated backbone into one
    stride-8 feature map, replacing dilated convolutions.

    The last three inputs (c2, c3, c4) are each projected to ``width`` channels, upsampled to c2's size,
    concatenated and passed through four parallel separable convolutions with dilations 1, 2, 4, 8.

    Args:
        in_channels: channels of (c2, c3, c4).
        width: channels of each projection and dilation branch.
        norm_layer: normalization layer class.
        dilations: dilations of the parallel branches.
        up_kwargs: PyTorch-Encoding's upsampling options ``{"mode": ..., "align_corners": ...}`` (PE passed
            ``align_corners=True``); default bilinear, ``align_corners=False``. A dict given in ``dilations``' place
            (PE's positional ``JPU(in_channels, width, norm_layer, up_kwargs)``) is taken as ``up_kwargs``.

    Shape:
        - Input: ``*features`` (e.g. c1, c2, c3, c4), the last three with ``in_channels`` channels.
        - Output: the same tuple with the last element replaced by ``B x (len(dilations) * width) x H2 x W2``
          (``H2 x W2`` the size of c2).
    """

    def __init__(self, in_channels: Sequence[int] = (512, 1024, 2048), width: int = 512,
                 norm_layer: NormLayer = nn.BatchNorm2d, dilations: Sequence[int] = (1, 2, 4, 8),
                 up_kwargs: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__()
        dilations, self.up_kwargs = positional_up_kwargs(dilations, (1, 2, 4, 8), up_kwargs, "JPU", "dilations")
        self.projections = nn.ModuleList(conv_norm_act(c, width, 3, norm_layer) for c in in_channels)
        self.dilations = nn.ModuleList(
            nn.Sequential(SeparableConv2d(len(in_channels) * width, width, 3, dilation=d, norm_layer=norm_layer),
                          norm_layer(width), nn.ReLU(inplace=True))
            for d in dilations)
        self.out_channels = len(dilations) * width

    def forward(self, *features: Tensor) -> Tuple[Tensor, ...]:
        n = len(self.projections)
        if len(features) < n:
            raise ValueError(f"JPU needs at least {n} feature maps, got {len(features)}")
        inputs = features[-n:]
        size = inputs[0].shape[-2:]
        feat = torch.cat([resize(proj(f), size, **self.up_kwargs) for proj, f in zip(self.projections, inputs)],
                         dim=1)
        feat = torch.cat([branch(feat) for branch in self.dilations], dim=1)
        return (*features[:-1], feat)
