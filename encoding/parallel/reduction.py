"""The exact-reduction protocol: how per-replica losses combine into the whole-batch loss.

A mean over a batch split across replicas is *not* the mean of the per-replica means unless every replica holds
the same number of contributing elements. PyTorch-Encoding averaged the per-device losses without weights, which is
biased for uneven splits (7 samples on 3 devices) and for uneven ignore masks. Here every loss is described as a list
of :class:`LossTerm` ``(total, count, weight)``; the whole-batch loss is

.. math::  L = \\sum_t w_t \\cdot \\frac{\\sum_i total_{i,t}}{\\sum_i count_{i,t}}

where ``i`` runs over replicas and ``t`` over terms. On a single device this is exactly the criterion's own value.

A criterion opts in by implementing ``loss_terms(*outputs_and_targets, **kwargs) -> Sequence[LossTerm]``
(and, to stay usable on its own, ``forward`` returning ``reduce_loss_terms([self.loss_terms(...)])``).
Without it, :func:`criterion_loss_terms` recognises ``nn.CrossEntropyLoss``/``nn.NLLLoss`` (normalised by the
(weighted) number of non-ignored targets), criteria with ``reduction='sum'`` (summed), and falls back to weighting
each replica's scalar loss by its share of the batch: exact for torch's per-sample means
(:data:`PER_SAMPLE_MEAN_LOSSES`), not for an unknown criterion (:func:`exact_loss_terms` says which).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LossTerm", "reduce_loss_terms", "criterion_loss_terms", "exact_loss_terms", "cross_entropy_terms",
           "valid_count", "PER_SAMPLE_MEAN_LOSSES"]

Number = Union[int, float]

#: torch losses whose ``reduction='mean'`` averages over the samples (or over a fixed number of elements per sample):
#: each replica's mean weighted by its share of the batch is the whole-batch mean, exactly.
PER_SAMPLE_MEAN_LOSSES = (nn.L1Loss, nn.MSELoss, nn.SmoothL1Loss, nn.HuberLoss, nn.BCELoss, nn.BCEWithLogitsLoss,
                          nn.SoftMarginLoss, nn.MultiLabelSoftMarginLoss, nn.KLDivLoss, nn.PoissonNLLLoss,
                          nn.GaussianNLLLoss)


class LossTerm(NamedTuple):
    """One additive term of a loss, in a form that sums exactly across replicas.

    Attributes:
        total: scalar tensor, the *sum* of this replica's (weighted) per-element losses for this term.
        count: the normaliser this replica contributes (e.g. number of non-ignored pixels, number of images), as a
            tensor or number; ``None`` means the term is a plain sum and is not normalised.
        weight: coefficient of the normalised term in the final loss (e.g. ``aux_weight``).
    """

    total: Tensor
    count: Optional[Union[Tensor, Number]] = None
    weight: float = 1.0


def _to(value: Union[Tensor, Number], device: torch.device, dtype: torch.dtype) -> Tensor:
    if isinstance(value, Tensor):
        return value.to(device=device, dtype=dtype)
    return torch.tensor(value, device=device, dtype=dtype)


def reduce_loss_terms(per_replica_terms: Sequence[Sequence[LossTerm]],
                      device: Optional[Union[torch.device, str]] = None) -> Tensor:
    """Combine the loss terms of every replica into the whole-batch loss.

    Args:
        per_replica_terms: one sequence of :class:`LossTerm` per replica, all with the same number of terms in the
            same order (term ``t`` of every replica describes the same quantity).
        device: where the result lives (default: the device of the first replica's first term).

    Returns:
        A scalar tensor ``sum_t weight_t * sum_i total_it / sum_i count_it`` (``count=None`` terms are summed).
        Autograd flows back into every replica's ``total`` (and ``count`` where it is differentiable).

    Example:
        >>> a = [LossTerm(torch.tensor(3.0), 2)]
        >>> b = [LossTerm(torch.tensor(1.0), 2)]
        >>> reduce_loss_terms([a, b])
        tensor(1.)
    """
    if not per_replica_terms:
        raise ValueError("reduce_loss_terms needs the terms of at least one replica")
    num_terms = {len(terms) for terms in per_replica_terms}
    if len(num_terms) != 1:
        raise ValueError(f"every replica must return the same number of loss terms, got {sorted(num_terms)}")
    first = per_replica_terms[0][0].total if per_replica_terms[0] else None
    if first is None:
        raise ValueError("a criterion returned no loss terms")
    device = torch.device(device) if device is not None else first.device
    dtype = first.dtype
    loss = None
    for t, group in enumerate(zip(*per_replica_terms)):
        weights = {term.weight for term in group}
        if len(weights) != 1:
            raise ValueError(f"loss term {t} has different weights on different replicas: {sorted(weights)}")
        total = sum(_to(term.total, device, dtype) for term in group)
        counts = [term.count for term in group]
        if all(c is None for c in counts):
            value = total
        elif any(c is None for c in counts):
            raise ValueError(f"loss term {t} has count=None on some replicas only")
        else:
            value = total / sum(_to(c, device, dtype) for c in counts)
        value = group[0].weight * value
        loss = value if loss is None else loss + value
    return loss


def valid_count(target: Tensor, valid: Tensor, weight: Optional[Tensor] = None) -> Tensor:
    """The normaliser of a mean (weighted) cross-entropy: torch divides by it with ``reduction='mean'``.

    Args:
        target: class indices.
        valid: mask of the targets that count (not ``ignore_index``).
        weight: optional class weights (on the target's device, in the loss dtype).

    Returns:
        The number of valid targets, or the sum of the class weights of the valid targets.
    """
    if weight is None:
        return valid.sum()
    return (weight[torch.where(valid, target, 0)] * valid).sum()


def cross_entropy_terms(criterion: Union[nn.CrossEntropyLoss, nn.NLLLoss], input: Tensor, target: Tensor) -> list:
    """Loss terms of ``nn.CrossEntropyLoss`` / ``nn.NLLLoss`` for one replica.

    With ``reduction='mean'`` torch divides the summed loss by ``sum(weight[target])`` over non-ignored targets
    (the count of non-ignored targets when there is no class weight); this returns that sum and that count so the
    mean can be formed over the whole batch. Soft (probability) targets are normalised by the number of samples.

    Args:
        criterion: the torch criterion (its ``weight``, ``ignore_index``, ``reduction`` and, for cross-entropy,
            ``label_smoothing`` are honoured).
        input: logits (``CrossEntropyLoss``) or log-probabilities (``NLLLoss``), ``N x C x ...``.
        target: class indices ``N x ...`` or, for cross-entropy, probabilities of the input's shape.

    Returns:
        A one-element list of :class:`LossTerm`.
    """
    kwargs = dict(weight=criterion.weight, ignore_index=criterion.ignore_index, reduction="sum")
    if isinstance(criterion, nn.CrossEntropyLoss):
        total = F.cross_entropy(input, target, label_smoothing=criterion.label_smoothing, **kwargs)
    else:
        total = F.nll_loss(input, target, **kwargs)
    if criterion.reduction == "sum":
        return [LossTerm(total, None)]
    if target.is_floating_point():  # probabilities: torch divides by the number of samples
        return [LossTerm(total, target.numel() // max(target.shape[1], 1) if target.dim() > 1 else 1)]
    weight = None if criterion.weight is None else criterion.weight.to(input.dtype)
    return [LossTerm(total, valid_count(target, target != criterion.ignore_index, weight))]


def _is_torch_loss(criterion: Any, classes: tuple) -> bool:
    """``criterion`` is one of torch's ``classes`` (a subclass counts only if it keeps torch's ``forward``)."""
    return any(isinstance(criterion, cls) and type(criterion).forward is cls.forward for cls in classes)


def criterion_loss_terms(criterion: Callable[..., Any], args: Sequence[Any], kwargs: dict,
                         batch_size: int) -> Union[list, Tensor]:
    """Evaluate ``criterion`` on one replica's arguments and describe the result as loss terms.

    Args:
        criterion: a module or callable. If it has ``loss_terms``, that method is used (the protocol); known torch
            criteria are handled by :func:`cross_entropy_terms`.
        args: the replica's ``(output, *targets)``.
        kwargs: the replica's keyword arguments.
        batch_size: the number of samples this replica holds (used for batch-share weighting).

    Returns:
        A list of :class:`LossTerm`, or — when the criterion returns a non-scalar (``reduction='none'``) — that
        tensor unchanged, to be gathered by the caller.
    """
    return exact_loss_terms(criterion, args, kwargs, batch_size)[0]


def exact_loss_terms(criterion: Callable[..., Any], args: Sequence[Any], kwargs: dict,
                     batch_size: int) -> Tuple[Union[list, Tensor], bool]:
    """:func:`criterion_loss_terms` and whether its terms reduce to the whole-batch value exactly.

    Exact: the protocol (``loss_terms``), ``nn.CrossEntropyLoss`` / ``nn.NLLLoss`` (sums over the weighted number of
    non-ignored targets), ``reduction='sum'``, a non-scalar result (gathered), and the batch-share weighting of
    :data:`PER_SAMPLE_MEAN_LOSSES`. Not exact: the batch-share weighting of any other scalar loss (a plain function,
    an unknown module), which equals the whole-batch loss only when that loss is a mean over samples.

    Returns:
        ``(terms_or_tensor, exact)``.
    """
    if hasattr(criterion, "loss_terms"):
        return list(criterion.loss_terms(*args, **kwargs)), True
    if _is_torch_loss(criterion, (nn.CrossEntropyLoss, nn.NLLLoss)) and criterion.reduction in ("mean", "sum") \
            and len(args) == 2 and not kwargs and isinstance(args[0], Tensor):
        return cross_entropy_terms(criterion, args[0], args[1]), True
    loss = criterion(*args, **kwargs)
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        return loss, True
    if getattr(criterion, "reduction", None) == "sum":
        return [LossTerm(loss, None)], True
    return [LossTerm(loss * batch_size, batch_size)], _is_torch_loss(criterion, PER_SAMPLE_MEAN_LOSSES)
