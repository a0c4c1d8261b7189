"""The heads and blocks shared between architectures.

:class:`FCNHead` is the FCN model's head and every model's auxiliary head (built by the factory on ``c3``);
:class:`PyramidPooling` is PSPNet's block, also on top of UperNet's feature pyramid. The heads used by one
architecture only live in its file (``encoding/models/<arch>.py``).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import torch
from torch import Tensor, nn

from ..nn.blocks import NormLayer, conv_norm_act, positional_up_kwargs, resize

__all__ = ["FCNHead", "PyramidPooling"]


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


class PyramidPooling(nn.Module):
    """PSPNet pyramid pooling: average-pool to ``bins`` grids, 1x1 conv, upsample, concatenate with the input.

    Args:
        in_channels: channels of the input.
        norm_layer: normalization layer class.
        bins: output grid sizes of the pooling branches.
        branch_channels: channels of each branch's 1x1 conv (default ``C // len(bins)``, PSPNet's and
            PyTorch-Encoding's; segmentation_models_pytorch's ``UPerNet`` uses 256).
        up_kwargs: PyTorch-Encoding's upsampling options ``{"mode": ..., "align_corners": ...}`` (PE passed
            ``align_corners=True``); default bilinear, ``align_corners=False``. A dict given in ``bins``' place
            (PE's positional ``PyramidPooling(in_channels, norm_layer, up_kwargs)``) is taken as ``up_kwargs``.

    Shape:
        - Input: ``B x C x H x W``.
        - Output: ``B x (C + len(bins) * branch_channels) x H x W`` (``2C`` with the defaults); the first ``C``
          channels are the input itself.
    """

    def __init__(self, in_channels: int, norm_layer: NormLayer = nn.BatchNorm2d,
                 bins: Sequence[int] = (1, 2, 3, 6), branch_channels: Optional[int] = None,
                 up_kwargs: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__()
        bins, self.up_kwargs = positional_up_kwargs(bins, (1, 2, 3, 6), up_kwargs, "PyramidPooling", "bins")
        if branch_channels is None:
            branch_channels = in_channels // len(bins)
        self.branches = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(b), *conv_norm_act(in_channels, branch_channels, 1, norm_layer))
            for b in bins)
        self.out_channels = in_channels + len(bins) * branch_channels

    def forward(self, x: Tensor) -> Tensor:
        size = x.shape[-2:]
        return torch.cat([x] + [resize(branch(x), size, **self.up_kwargs) for branch in self.branches], dim=1)
