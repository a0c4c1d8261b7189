"""EncNet (Zhang et al., "Context Encoding for Semantic Segmentation", CVPR 2018).

The head encodes the last stage with an :class:`~encoding.nn.Encoding` layer into channel-wise attention and, with
``se_loss``, "which classes are present" logits for the semantic-encoding loss; ``lateral=True`` also fuses ``c2``
and ``c3`` (the multi-level variant).
"""
from __future__ import annotations

from typing import Sequence

from torch import nn

from ..nn.customize import EncHead, NormLayer
from .base import SegmentationModel

__all__ = ["EncNet", "encnet_head"]


class EncNet(SegmentationModel):
    """Context encoding network: backbone → :class:`~encoding.nn.EncHead` on ``(c2, c3, c4)`` (``c2``/``c3`` are
    used only by the lateral variant). The output dict has ``"se"`` when the head was built with ``se_loss``. See
    :class:`SegmentationModel` for the arguments."""

    head_inputs = (1, 2, 3)


def encnet_head(channels: Sequence[int], nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
                output_stride: int = 8, se_loss: bool = False, lateral: bool = False,
                ncodes: int = 32) -> nn.Module:
    """The EncNet head for backbone stage ``channels``.

    Args:
        se_loss: add the SE-loss branch (``"se"`` logits).
        lateral: fuse ``c2`` and ``c3`` into the encoded feature map.
        ncodes: number of codewords.
    """
    return EncHead(channels[3], nclass, se_loss=se_loss, lateral=lateral, lateral_channels=channels[1:3],
                   ncodes=ncodes, norm_layer=norm_layer)
