"""Binary (foreground / background) segmentation losses on one output channel, reduced exactly across replicas.

A binary network has ONE logit channel (``B x 1 x H x W``); the target is ``B x H x W`` with ``0`` (background),
``1`` (foreground) or ``ignore_index``. The three losses follow ``segmentation_models_pytorch``'s ``mode="binary"``
definitions (the tests compare them numerically in float64), ignored pixels removed:

* :class:`BinaryBCELoss`: ``BCEWithLogits`` averaged over the valid pixels (a :class:`~encoding.parallel.LossTerm`);
* :class:`BinaryDiceLoss`: ``1 - (I + smooth) / max((sum p + sum t) / 2 + smooth, eps)`` over the whole batch with
  ``p = exp(logsigmoid(x))`` (0 when the batch has no foreground); its statistics are summed over the replicas
  (a :class:`~encoding.parallel.reduction.StatisticsTerm`);
* :class:`BinaryFocalLoss`: ``(1 - p_t)^gamma * BCE`` (``alpha`` weighting positives), averaged over the valid pixels.

Predictions are ``sigmoid(x) > threshold`` (:func:`encoding.utils.metrics.to_labels` with a 1-channel output).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Type

import torch
import torch.nn.functional as F
from torch import Tensor

from ..parallel.reduction import LossTerm, StatisticsTerm
from .loss import SegmentationLosses
from .loss.focal import focal_factor

__all__ = ["BinaryBCELoss", "BinaryDiceLoss", "BinaryFocalLoss", "BINARY_LOSSES"]


def _wide(logits: Tensor) -> Tensor:
    """The single logit channel ``B x ...`` in at least float32."""
    return logits[:, 0].to(torch.promote_types(logits.dtype, torch.float32))


class _BinaryLoss(SegmentationLosses):
    """One logit channel, targets ``{0, 1, ignore_index}``; no SE term, no class weights, no label smoothing."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("nclass", None)  # two classes, one channel
        super().__init__(nclass=1, **kwargs)
        if self.se_loss or self.weight is not None or self.label_smoothing:
            raise ValueError(f"{type(self).__name__} takes no se_loss, class weights or label_smoothing")

    def _check_target(self, target: Tensor, out: Tensor) -> Tensor:
        valid = target != self.ignore_index
        if target.shape != out.shape[:1] + out.shape[2:]:
            raise ValueError(f"the target must be B x spatial = {tuple(out.shape[:1] + out.shape[2:])} for an "
                             f"output of shape {tuple(out.shape)}, got {tuple(target.shape)}")
        if target.is_floating_point() or target.is_complex():
            raise ValueError(f"the target must hold integer class indices, got dtype {target.dtype}")
        bad = valid & ((target < 0) | (target > 1))
        if target.numel() and bool(bad.any()):
            raise ValueError(f"binary target values {target[bad].unique()[:10].tolist()} are not 0, 1 or "
                             f"ignore_index={self.ignore_index}")
        return valid


class BinaryBCELoss(_BinaryLoss):
    """``BCEWithLogits`` averaged over the valid pixels (smp's ``SoftBCEWithLogitsLoss`` when nothing is ignored).

    Args:
        pos_weight: weight of the positive (foreground) pixels' term, as ``nn.BCEWithLogitsLoss``'s.
        **kwargs: :class:`SegmentationLosses`' ``aux``, ``aux_weight``, ``ignore_index``.

    Example:
        >>> loss = BinaryBCELoss()(torch.randn(2, 1, 8, 8), torch.randint(-1, 2, (2, 8, 8)))
    """

    def __init__(self, pos_weight: Optional[float] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pos_weight = None if pos_weight is None else float(pos_weight)

    def _pixel_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> LossTerm:
        x = _wide(logits)
        t = torch.where(valid, target, 0).to(x.dtype)
        pos = None if self.pos_weight is None else torch.tensor(self.pos_weight, dtype=x.dtype, device=x.device)
        bce = F.binary_cross_entropy_with_logits(x, t, pos_weight=pos, reduction="none")
        return LossTerm((bce * valid).sum(), valid.sum(), coeff)


class BinaryDiceLoss(_BinaryLoss):
    """smp's ``DiceLoss(mode="binary", from_logits=True)``: soft Dice of the foreground over the whole batch.

    Args:
        smooth: added to the intersection and the half cardinality (smp's ``smooth``).
        eps: lower bound of the denominator (smp's ``eps``).
        log_loss: ``-log(max(dice, eps))`` instead of ``1 - dice``.
        **kwargs: :class:`SegmentationLosses`' ``aux``, ``aux_weight``, ``ignore_index``.

    Example:
        >>> loss = BinaryDiceLoss()(torch.randn(2, 1, 8, 8), torch.randint(-1, 2, (2, 8, 8)))
    """

    def __init__(self, smooth: float = 0.0, eps: float = 1e-7, log_loss: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if smooth < 0 or eps < 0:
            raise ValueError(f"smooth and eps must be >= 0, got smooth={smooth}, eps={eps}")
        self.smooth, self.eps, self.log_loss = float(smooth), float(eps), bool(log_loss)

    def finish(self, intersection: Tensor, false_pos: Tensor, false_neg: Tensor) -> Tensor:
        """The loss from the whole batch's ``sum p t``, ``sum p (1 - t)`` and ``sum (1 - p) t``."""
        dice = (intersection + self.smooth) / (intersection + 0.5 * false_pos + 0.5 * false_neg
                                               + self.smooth).clamp_min(self.eps)
        loss = -dice.clamp_min(self.eps).log() if self.log_loss else 1.0 - dice
        return loss * ((intersection + false_neg) > 0).to(loss.dtype)

    def _pixel_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> StatisticsTerm:
        x = _wide(logits)
        p = F.logsigmoid(x).exp() * valid
        t = (torch.where(valid, target, 0) * valid).to(x.dtype)
        stats = ((p * t).sum(), (p * (1.0 - t)).sum(), ((1.0 - p) * t).sum())
        return StatisticsTerm(stats, self.finish, coeff, "sum")


class BinaryFocalLoss(_BinaryLoss):
    """smp's ``FocalLoss(mode="binary")``: ``(1 - p_t)^gamma * BCE`` averaged over the valid pixels.

    Args:
        gamma: focusing exponent (>= 0).
        alpha: weight of the positive pixels (``1 - alpha`` for the negatives); ``None``: none.
        **kwargs: :class:`SegmentationLosses`' ``aux``, ``aux_weight``, ``ignore_index``.

    Example:
        >>> loss = BinaryFocalLoss(gamma=2.0)(torch.randn(2, 1, 8, 8), torch.randint(-1, 2, (2, 8, 8)))
    """

    def __init__(self, gamma: float = 2.0, alpha: Optional[float] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if gamma < 0 or (alpha is not None and not 0.0 <= alpha <= 1.0):
            raise ValueError(f"gamma must be >= 0 and alpha in [0, 1], got gamma={gamma}, alpha={alpha}")
        self.gamma, self.alpha = float(gamma), alpha

    def _pixel_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> LossTerm:
        x = _wide(logits)
        t = torch.where(valid, target, 0).to(x.dtype)
        bce = F.binary_cross_entropy_with_logits(x, t, reduction="none")
        focal = focal_factor(-bce, self.gamma) * bce
        if self.alpha is not None:
            focal = focal * (self.alpha * t + (1.0 - self.alpha) * (1.0 - t))
        return LossTerm((focal * valid).sum(), valid.sum(), coeff)


#: ``train.py --binary --loss`` name -> the binary criterion (``ce`` and ``bce`` both mean BCEWithLogits).
BINARY_LOSSES: Dict[str, Type[SegmentationLosses]] = {"ce": BinaryBCELoss, "bce": BinaryBCELoss,
                                                      "dice": BinaryDiceLoss, "focal": BinaryFocalLoss}
