"""Lovász-Softmax loss (:class:`LovaszSoftmaxLoss`, :func:`lovasz_softmax_flat`): the replicas' valid-pixel
probabilities and labels concatenated (:class:`~encoding.parallel.reduction.StatisticsTerm`), sorted once."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ...parallel.reduction import LossTerm, StatisticsTerm
from .pixel import _one_hot, _PixelLoss, _probabilities

__all__ = ["LovaszSoftmaxLoss", "lovasz_softmax_flat"]


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
