"""Soft Dice loss (:class:`DiceLoss`): per-class statistics summed over the replicas
(:class:`~encoding.parallel.reduction.StatisticsTerm`), finished once for the whole batch."""
from __future__ import annotations

from typing import Any

from torch import Tensor

from ...parallel.reduction import StatisticsTerm
from .pixel import _one_hot, _PixelLoss, _probabilities

__all__ = ["DiceLoss"]


class DiceLoss(_PixelLoss):
    """Soft Dice loss over the whole batch (multi-class, softmax), smp's ``DiceLoss(mode="multiclass")``.

    Per class ``c``, over the valid pixels of the whole batch, with ``p`` the softmax probabilities and ``t`` the
    one-hot target: ``I_c = sum p_c t_c``, ``S_c = sum p_c + sum t_c`` and
    ``dice_c = (I_c + smooth) / max(S_c / 2 + smooth, eps)``; the class loss is ``1 - dice_c`` (``-log(max(dice_c,
    eps))`` with ``log_loss``), set to 0 for classes absent from the target; the loss is the mean over all classes
    (weighted: ``sum w_c loss_c / sum w_c``).

    Args:
        smooth: added to the intersection and to the half cardinality (smp's ``smooth``).
        eps: lower bound of the denominator (smp's ``eps``).
        log_loss: ``-log(dice)`` instead of ``1 - dice``.
        **kwargs: :class:`SegmentationLosses`' arguments (``aux``, ``aux_weight``, ``weight``, ``ignore_index``,
            ``nclass``, ``se_loss``, ...).

    Example:
        >>> criterion = DiceLoss(aux=True, aux_weight=0.4)
        >>> output = {"out": torch.randn(2, 5, 8, 8), "aux": torch.randn(2, 5, 8, 8)}
        >>> loss = criterion(output, torch.randint(-1, 5, (2, 8, 8)))
    """

    def __init__(self, smooth: float = 0.0, eps: float = 1e-7, log_loss: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if smooth < 0 or eps < 0:
            raise ValueError(f"smooth and eps must be >= 0, got smooth={smooth}, eps={eps}")
        self.smooth, self.eps, self.log_loss = float(smooth), float(eps), bool(log_loss)

    def extra_repr(self) -> str:
        return f"smooth={self.smooth}, eps={self.eps}, log_loss={self.log_loss}, " + super().extra_repr()

    def dice_statistics(self, logits: Tensor, target: Tensor, valid: Tensor) -> tuple:
        """``(intersection, cardinality, target pixels)`` per class over the valid pixels of ``logits``."""
        prob = _probabilities(logits)
        hot = _one_hot(target, valid, prob.shape[1], prob.dtype)
        prob = prob * valid.unsqueeze(1).to(prob.dtype)
        dims = [0] + list(range(2, prob.dim()))
        return (prob * hot).sum(dims), prob.sum(dims) + hot.sum(dims), hot.sum(dims)

    def finish(self, intersection: Tensor, cardinality: Tensor, present: Tensor) -> Tensor:
        """The Dice loss from the per-class statistics of the whole batch."""
        dice = (intersection + self.smooth) / (cardinality / 2 + self.smooth).clamp_min(self.eps)
        loss = -dice.clamp_min(self.eps).log() if self.log_loss else 1.0 - dice
        loss = loss * (present > 0).to(loss.dtype)
        weight = self._class_weights_of(loss)
        return (loss * weight).sum() / weight.sum()

    def _pixel_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> StatisticsTerm:
        return StatisticsTerm(self.dice_statistics(logits, target, valid), self.finish, coeff, "sum")
