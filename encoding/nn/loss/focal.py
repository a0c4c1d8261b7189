"""Focal loss (:class:`FocalLoss`): softmax or smp's one-vs-rest sigmoid form, a mean over the valid pixels
(a :class:`~encoding.parallel.LossTerm`)."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ...parallel.reduction import LossTerm
from .pixel import _one_hot, _PixelLoss

__all__ = ["FocalLoss"]


def focal_factor(log_p: Tensor, gamma: float) -> Tensor:
    """The focal modulation ``(1 - p)^gamma`` from ``log p`` (``<= 0``), finite in value and gradient.

    ``1 - p`` is computed as ``-expm1(log p)`` and the power's gradient is 0 where ``1 - p == 0`` (a confidently
    right pixel): ``pow``'s own backward there is ``gamma * 0^(gamma - 1) = inf`` for ``0 < gamma < 1``, which turns
    into NaN downstream; the true derivative of the focal term at that point is 0.

    Args:
        log_p: log-probabilities.
        gamma: focusing exponent (>= 0).

    Returns:
        ``(1 - p)^gamma``, same shape as ``log_p`` (ones for ``gamma == 0``).
    """
    q = -torch.expm1(log_p)
    if gamma == 0:
        return torch.ones_like(q)
    positive = q > 0
    return torch.where(positive, torch.where(positive, q, 1.0).pow(gamma), 0.0)


class FocalLoss(_PixelLoss):
    """Focal loss (Lin et al.), a mean over the valid pixels.

    ``activation="softmax"`` (default): ``FL = -(1 - p_y)^gamma log p_y`` per pixel with ``p_y`` the softmax
    probability of the true class; the loss is ``sum w_y FL / sum w_y`` over the valid pixels (``w``: class
    weights, 1 without), which is :class:`SegmentationLosses`' cross-entropy for ``gamma=0``.
    ``activation="sigmoid"``: smp's ``FocalLoss(mode="multiclass")``, a one-vs-rest binary focal loss per class on
    the sigmoid of each channel, ``alpha`` weighting positives / negatives, averaged over the valid pixels and then
    over the classes (weighted: ``sum w_c L_c / sum w_c``).

    Args:
        gamma: focusing exponent (>= 0).
        activation: ``"softmax"`` or ``"sigmoid"``.
        alpha: sigmoid only: the weight of the positive targets (``1 - alpha`` for the negatives); ``None``: none.
        **kwargs: :class:`SegmentationLosses`' arguments.

    Example:
        >>> loss = FocalLoss(gamma=2.0)(torch.randn(2, 5, 8, 8), torch.randint(-1, 5, (2, 8, 8)))
    """

    def __init__(self, gamma: float = 2.0, activation: str = "softmax", alpha: Optional[float] = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        if activation not in ("softmax", "sigmoid"):
            raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}")
        if alpha is not None and (activation != "sigmoid" or not 0.0 <= alpha <= 1.0):
            raise ValueError(f"alpha (a probability in [0, 1]) applies to activation='sigmoid' only, got "
                             f"alpha={alpha} with activation={activation!r}; use class weights with softmax")
        self.gamma, self.activation, self.alpha = float(gamma), activation, alpha

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}, activation={self.activation!r}, alpha={self.alpha}, " + super().extra_repr()

    def _pixel_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> LossTerm:
        if self.activation == "sigmoid":
            return self._sigmoid_term(logits, target, valid, coeff)
        logp = logits.log_softmax(1, dtype=torch.promote_types(logits.dtype, torch.float32))
        logp_y = logp.gather(1, torch.where(valid, target, 0).unsqueeze(1)).squeeze(1)
        focal = -focal_factor(logp_y, self.gamma) * logp_y
        weight = self._class_weight(logp)
        pixel_weight = valid.to(logp.dtype) if weight is None else weight[torch.where(valid, target, 0)] * valid
        return LossTerm((focal * pixel_weight).sum(), pixel_weight.sum(), coeff)

    def _sigmoid_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> LossTerm:
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        hot = _one_hot(target, valid, logits.shape[1], logits.dtype)
        bce = F.binary_cross_entropy_with_logits(logits, hot, reduction="none")
        focal = focal_factor(-bce, self.gamma) * bce
        if self.alpha is not None:
            focal = focal * (self.alpha * hot + (1.0 - self.alpha) * (1.0 - hot))
        weight = self._class_weights_of(focal.movedim(1, -1))
        focal = focal.movedim(1, -1) * weight * valid.unsqueeze(-1).to(focal.dtype)
        return LossTerm(focal.sum(), valid.sum() * weight.sum(), coeff)
