"""What Dice, Focal and Lovász-Softmax share: softmax probabilities in at least float32, the one-hot of the valid
pixels, and the base :class:`_PixelLoss` (a :class:`~encoding.nn.loss.SegmentationLosses` without label
smoothing)."""
from __future__ import annotations

from typing import Any, List

import torch
import torch.nn.functional as F
from torch import Tensor

from .cross_entropy import SegmentationLosses

__all__: List[str] = []  # shared by the loss modules of this package, not public


def _probabilities(logits: Tensor) -> Tensor:
    """Softmax over classes in at least float32 (float64 stays float64)."""
    return logits.softmax(1, dtype=torch.promote_types(logits.dtype, torch.float32))


def _one_hot(target: Tensor, valid: Tensor, nclass: int, dtype: torch.dtype) -> Tensor:
    """``B x nclass x ...`` one-hot of the valid pixels (all zeros at ignored pixels)."""
    hot = F.one_hot(torch.where(valid, target, 0), nclass).movedim(-1, 1).to(dtype)
    return hot * valid.unsqueeze(1).to(dtype)


class _PixelLoss(SegmentationLosses):
    """Shared checks: these losses take no label smoothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.label_smoothing:
            raise ValueError(f"{type(self).__name__} does not take label_smoothing (got {self.label_smoothing})")

    def _class_weights_of(self, like: Tensor) -> Tensor:
        """The class weights (ones without ``weight``) in ``like``'s dtype and device."""
        weight = self._class_weight(like)
        return torch.ones(like.shape[-1], dtype=like.dtype, device=like.device) if weight is None else weight
