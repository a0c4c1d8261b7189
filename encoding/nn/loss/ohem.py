"""Cross-entropy with online hard example mining (:class:`OhemCrossEntropy`), mined over the whole batch, exact
across replicas."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...parallel.reduction import StatisticsTerm
from .cross_entropy import SegmentationLosses

__all__ = ["OhemCrossEntropy"]


class OhemCrossEntropy(SegmentationLosses):
    """Cross-entropy with online hard example mining (the Cityscapes recipe of PSPNet/OCNet/TorchSeg).

    For each pixel term, only the *hard* valid pixels count: those whose softmax probability of the true class is
    ``<= threshold``, where ``threshold = max(thresh, p_k)`` and ``p_k`` is the ``min_kept``-th smallest true-class
    probability, so at least ``min_kept`` pixels are kept (all valid pixels when there are fewer). The loss is the
    (weighted) mean cross-entropy over the kept pixels. Everything else — dict / tensor outputs, the auxiliary and SE
    terms, class weights, label smoothing, target checks — is :class:`SegmentationLosses`; mining applies to the main
    and the auxiliary output, each selecting its own hard pixels.

    Across replicas (:class:`encoding.parallel.DataParallelCriterion`): each replica returns every pixel's loss,
    true-class probability and weight (a ``"cat"`` :class:`~encoding.parallel.reduction.StatisticsTerm`, three numbers
    per pixel), and the threshold and the mean are taken once over the whole batch's pixels: the loss and its
    gradients equal the single-device ones, also where ``min_kept`` decides (per-replica mining, as in the usual
    distributed OHEM implementations, keeps more pixels than one device would there).

    Args:
        thresh: probability threshold of a hard pixel (0.7 in the Cityscapes recipes).
        min_kept: minimum number of pixels kept per call (over the whole batch, across replicas too); ``0`` disables
            it.
        **kwargs: the arguments of :class:`SegmentationLosses` (``se_loss``, ``aux``, ``weight``, ``ignore_index``,
            ``label_smoothing``, ...).

    Shape:
        As :class:`SegmentationLosses`.

    Example:
        >>> criterion = OhemCrossEntropy(thresh=0.7, min_kept=10)
        >>> loss = criterion(torch.randn(2, 19, 16, 16), torch.randint(-1, 19, (2, 16, 16)))
    """

    def __init__(self, thresh: float = 0.7, min_kept: int = 100000, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0.0 <= thresh <= 1.0:
            raise ValueError(f"thresh must be a probability in [0, 1], got {thresh}")
        if min_kept < 0:
            raise ValueError(f"min_kept must be >= 0, got {min_kept}")
        self.thresh = float(thresh)
        self.min_kept = int(min_kept)

    def extra_repr(self) -> str:
        return f"thresh={self.thresh}, min_kept={self.min_kept}, " + super().extra_repr()

    def true_class_probability(self, logits: Tensor, target: Tensor, valid: Tensor) -> Tensor:
        """Softmax probability of each pixel's true class (``inf`` where not ``valid``), without gradient."""
        with torch.no_grad():
            safe = torch.where(valid, target, 0).unsqueeze(1)
            dtype = torch.promote_types(logits.dtype, torch.float32)
            prob = logits.to(dtype).log_softmax(1).gather(1, safe).squeeze(1).exp()
            return prob.masked_fill(~valid, float("inf"))

    def threshold(self, prob: Tensor) -> Tensor:
        """``max(thresh, p_k)`` for true-class probabilities ``prob`` (``inf`` for ignored pixels), ``p_k`` the
        ``min_kept``-th smallest (no host synchronisation)."""
        threshold = torch.tensor(self.thresh, dtype=prob.dtype, device=prob.device)
        k = min(self.min_kept, prob.numel())
        return torch.maximum(threshold, prob.flatten().kthvalue(k).values) if k > 0 else threshold

    def hard_pixels(self, logits: Tensor, target: Tensor, valid: Tensor) -> Tensor:
        """Mask of the pixels among ``valid`` that mining keeps when ``logits`` is the whole batch."""
        prob = self.true_class_probability(logits, target, valid)
        return valid & (prob <= self.threshold(prob))

    def finish(self, losses: Tensor, prob: Tensor, weights: Tensor) -> Tensor:
        """The (weighted) mean cross-entropy over the hard pixels, from every pixel's loss, true-class probability
        and weight (flat, the whole batch's: the replicas' concatenated)."""
        keep = prob <= self.threshold(prob)
        return torch.where(keep, losses, 0).sum() / torch.where(keep, weights, 0).sum()

    def _pixel_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> StatisticsTerm:
        weight = self._class_weight(logits)
        losses = F.cross_entropy(logits, target, weight=weight, ignore_index=self.ignore_index, reduction="none",
                                 label_smoothing=self.label_smoothing)
        weights = valid.to(losses.dtype) if weight is None else weight[torch.where(valid, target, 0)] * valid
        prob = self.true_class_probability(logits, target, valid)
        return StatisticsTerm((losses.flatten(), prob.flatten(), weights.flatten()), self.finish, coeff, "cat")
