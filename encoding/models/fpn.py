"""Feature-pyramid models on a non-dilated backbone: FCFPN and UperNet (Xiao et al., ECCV 2018)."""
from __future__ import annotations

from typing import Sequence

from torch import nn

from ..nn.customize import FPNHead, NormLayer
from .base import SegmentationModel

__all__ = ["FCFPN", "UperNet", "fcfpn_head", "upernet_head"]


class FCFPN(SegmentationModel):
    """Fully convolutional FPN: backbone → :class:`~encoding.nn.FPNHead` over ``c1..c4``, logits at stride 4.
    See :class:`SegmentationModel` for the arguments and the output dict."""

    head_inputs = (0, 1, 2, 3)


class UperNet(FCFPN):
    """Unified perceptual parsing network: FCFPN with pyramid pooling on the top level."""


def fcfpn_head(channels: Sequence[int], nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
               output_stride: int = 32, fpn_dim: int = 256) -> nn.Module:
    """The FCFPN head for backbone stage ``channels`` (uses ``c1..c4``)."""
    return FPNHead(channels, nclass, norm_layer, fpn_dim=fpn_dim)


def upernet_head(channels: Sequence[int], nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
                 output_stride: int = 32, fpn_dim: int = 256) -> nn.Module:
    """The UperNet head for backbone stage ``channels`` (uses ``c1..c4``, pyramid pooling on ``c4``)."""
    return FPNHead(channels, nclass, norm_layer, fpn_dim=fpn_dim, pyramid_pooling=True)
