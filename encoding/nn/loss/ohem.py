"""Cross-entropy with online hard example mining (:class:`OhemCrossEntropy`), exact across replicas when the
probability threshold decides."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...parallel.reduction import LossTerm
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

    Across replicas (:class:`encoding.parallel.DataParallelCriterion`): the kept pixels are selected per replica and
    the mean is taken exactly over the union of the kept pixels of all replicas (sum and count are reduced). This
    equals the single-device loss whenever the probability threshold decides, i.e. every replica has at least
    ``min_kept`` valid pixels with true-class probability ``<= thresh`` (the usual case for a trained model). Otherwise
    ``min_kept`` acts per replica, like in every distributed OHEM implementation: more pixels are kept in total than
    one device would keep, and the loss is an approximation of the single-device one.

    Args:
        thresh: probability threshold of a hard pixel (0.7 in the Cityscapes recipes).
        min_kept: minimum number of pixels kept per call (per replica); ``0`` disables it.
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

    def hard_pixels(self, logits: Tensor, target: Tensor, valid: Tensor) -> Tensor:
        """Mask of the kept (hard) pixels among ``valid`` for ``logits`` (no gradient, no host synchronisation)."""
        with torch.no_grad():
            safe = torch.where(valid, target, 0).unsqueeze(1)
            prob = logits.float().log_softmax(1).gather(1, safe).squeeze(1).exp()
            prob = prob.masked_fill(~valid, float("inf"))
            threshold = torch.tensor(self.thresh, dtype=prob.dtype, device=prob.device)
            k = min(self.min_kept, prob.numel())
            if k > 0:
                threshold = torch.maximum(threshold, prob.flatten().kthvalue(k).values)
            return valid & (prob <= threshold)

    def _pixel_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> LossTerm:
        keep = self.hard_pixels(logits, target, valid)
        kept_target = target.masked_fill(~keep, self.ignore_index)
        return super()._pixel_term(logits, kept_target, keep, coeff)
