"""Dice, Focal and Lovász-Softmax losses, reduced exactly across replicas; the registry of ``train.py --loss``.

Each loss is a :class:`~encoding.nn.loss.SegmentationLosses` whose pixel term is replaced, so the auxiliary and SE
terms, class weights (``weight``), ``ignore_index``, dict / tensor outputs and the target checks are the same as for
the cross-entropy. Focal is a per-pixel mean: a :class:`~encoding.parallel.LossTerm` ``(total, count)``. Dice and
batch Lovász-Softmax are not means of per-pixel values: their pixel terms are
:class:`~encoding.parallel.reduction.StatisticsTerm`\\ s -- Dice's per-class intersections and cardinalities are
summed over the replicas, Lovász's valid-pixel probabilities and labels concatenated -- finished on the output
device by the same function a single device applies to the whole batch. So under
:class:`~encoding.parallel.DataParallelCriterion` each loss equals (value and gradients) the single-device loss of the
whole batch. Conventions follow ``segmentation_models_pytorch`` (``mode="multiclass"``) where noted; ``docs/nn.md``
lists them and the tests compare with smp numerically.
"""
from __future__ import annotations

from typing import Any, Optional, Type

import torch
import torch.nn.functional as F
from torch import Tensor

from ..parallel.reduction import LossTerm, StatisticsTerm
from ..registry import Registry
from .loss import OhemCrossEntropy, SegmentationLosses

__all__ = ["DiceLoss", "FocalLoss", "LovaszSoftmaxLoss", "LOSSES", "lovasz_softmax_flat"]


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
        focal = -(1.0 - logp_y.exp()).pow(self.gamma) * logp_y
        weight = self._class_weight(logp)
        pixel_weight = valid.to(logp.dtype) if weight is None else weight[torch.where(valid, target, 0)] * valid
        return LossTerm((focal * pixel_weight).sum(), pixel_weight.sum(), coeff)

    def _sigmoid_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> LossTerm:
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        hot = _one_hot(target, valid, logits.shape[1], logits.dtype)
        bce = F.binary_cross_entropy_with_logits(logits, hot, reduction="none")
        focal = (1.0 - (-bce).exp()).pow(self.gamma) * bce
        if self.alpha is not None:
            focal = focal * (self.alpha * hot + (1.0 - self.alpha) * (1.0 - hot))
        weight = self._class_weights_of(focal.movedim(1, -1))
        focal = focal.movedim(1, -1) * weight * valid.unsqueeze(-1).to(focal.dtype)
        return LossTerm(focal.sum(), valid.sum() * weight.sum(), coeff)


def lovasz_softmax_flat(prob: Tensor, labels: Tensor, valid: Optional[Tensor] = None,
                        weight: Optional[Tensor] = None) -> Tensor:
    """Lovász-Softmax (Berman et al. 2018) of ``P x C`` probabilities and their ``P`` labels, present classes only.

    Per class, the errors ``|1[label = c] - p_c|`` of the valid pixels are sorted in decreasing order and dotted with
    the gradient of the Lovász extension of the Jaccard loss; the loss is the (``weight``-weighted) mean over the
    classes that occur among the valid labels, and 0 (with a zero gradient) when no pixel is valid. Invalid pixels
    (``valid`` false; their labels may be anything) get the error -1: they sort last, after every foreground pixel,
    where the Jaccard gradient is 0, so they add nothing -- without a data-dependent shape (fake tensors work).
    """
    valid = torch.ones_like(labels, dtype=torch.bool) if valid is None else valid
    fg = _one_hot(labels, valid, prob.shape[1], prob.dtype)
    errors = torch.where(valid.unsqueeze(1), (fg - prob).abs(), -1.0)
    errors, order = errors.sort(dim=0, descending=True, stable=True)
    fg_sorted = fg.gather(0, order)
    gts = fg_sorted.sum(0)
    jaccard = 1.0 - (gts - fg_sorted.cumsum(0)) / (gts + (1.0 - fg_sorted).cumsum(0))
    grad = torch.cat([jaccard[:1], jaccard[1:] - jaccard[:-1]])
    losses = (errors * grad).sum(0)
    weight = (gts > 0).to(prob.dtype) * (1.0 if weight is None else weight)
    return (losses * weight).sum() / weight.sum().clamp_min(torch.finfo(prob.dtype).tiny)


class LovaszSoftmaxLoss(_PixelLoss):
    """Lovász-Softmax loss (Berman et al. 2018), smp's ``LovaszLoss(mode="multiclass")``: the softmax's surrogate of
    the per-class Jaccard index, averaged over the classes present in the target.

    ``per_image=False`` (default): one loss over all valid pixels of the batch (a function of the sorted errors of
    every pixel: replicas send their valid-pixel probabilities and labels to the output device, which sorts them
    once; ignored pixels travel too, masked, so no shape depends on the data). ``per_image=True``: the mean over
    the images that have valid pixels of each image's loss. Class weights make the class mean weighted (smp has
    none).

    Args:
        per_image: compute the loss per image, then average.
        **kwargs: :class:`SegmentationLosses`' arguments.

    Example:
        >>> loss = LovaszSoftmaxLoss()(torch.randn(2, 5, 8, 8), torch.randint(-1, 5, (2, 8, 8)))
    """

    def __init__(self, per_image: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.per_image = bool(per_image)

    def extra_repr(self) -> str:
        return f"per_image={self.per_image}, " + super().extra_repr()

    def finish(self, prob: Tensor, labels: Tensor, valid: Tensor) -> Tensor:
        """The loss of pixel probabilities ``P x C``, labels ``P`` and valid mask ``P`` (the whole batch's, or one
        image's)."""
        return lovasz_softmax_flat(prob, labels, valid, self._class_weight(prob))

    def _pixel_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> Any:
        prob = _probabilities(logits).movedim(1, -1)
        flat = (prob.reshape(-1, prob.shape[-1]), target.reshape(-1), valid.reshape(-1))
        if not self.per_image:
            return StatisticsTerm(flat, self.finish, coeff, "cat")
        losses = [self.finish(p.reshape(-1, p.shape[-1]), t.reshape(-1), v.reshape(-1))
                  for p, t, v in zip(prob, target, valid)]
        images = valid.flatten(1).any(1)
        total = torch.stack(losses).sum() if losses else prob.sum() * 0
        return LossTerm(total, images.sum(), coeff)


#: ``train.py --loss`` name -> the criterion class (all take :class:`SegmentationLosses`' arguments).
LOSSES: Registry[Type[SegmentationLosses]] = Registry("loss", {
    "ce": SegmentationLosses, "ohem": OhemCrossEntropy, "dice": DiceLoss, "focal": FocalLoss, "lovasz": LovaszSoftmaxLoss})
