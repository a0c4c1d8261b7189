"""The exact-reduction protocol: how per-replica losses combine into the whole-batch loss.

A mean over a batch split across replicas is *not* the mean of the per-replica means unless every replica holds
the same number of contributing elements. PyTorch-Encoding averaged the per-device losses without weights, which is
biased for uneven splits (7 samples on 3 devices) and for uneven ignore masks. Here every loss is described as a list
of :class:`LossTerm` ``(total, count, weight)``; the whole-batch loss is

.. math::  L = \\sum_t w_t \\cdot \\frac{\\sum_i total_{i,t}}{\\sum_i count_{i,t}}

where ``i`` runs over replicas and ``t`` over terms. On a single device this is exactly the criterion's own value.

A loss that is not a ratio of two sums (Dice: a ratio per class of summed intersections and cardinalities; batch
Lovász-Softmax: a function of the sorted errors of *all* pixels) is described by a :class:`StatisticsTerm`
``(statistics, finish, weight, combine)``: each replica returns its statistics (a tuple of tensors), which are
*combined* on the output device -- summed elementwise (``combine="sum"``) or concatenated along dimension 0
(``combine="cat"``) -- and then *finished* by ``finish(*combined)``, the same function the criterion applies to
the statistics of the whole batch on one device. Summing and concatenating are exact and differentiable, so the
result and its gradients equal the whole-batch loss. (A :class:`LossTerm` is the special case
``statistics=(total, count)``, ``combine="sum"``, ``finish=total / count``.)

A criterion opts in by implementing ``loss_terms(*outputs_and_targets, **kwargs) -> Sequence[LossTerm]``
(and, to stay usable on its own, ``forward`` returning ``reduce_loss_terms([self.loss_terms(...)])``).
Without it, :func:`criterion_loss_terms` recognises ``nn.CrossEntropyLoss``/``nn.NLLLoss`` (normalised by the
(weighted) number of non-ignored targets), criteria with ``reduction='sum'`` (summed), and falls back to weighting
each replica's scalar loss by its share of the batch: exact for torch's per-sample means
(:data:`PER_SAMPLE_MEAN_LOSSES`), not for an unknown criterion (:func:`exact_loss_terms` says which).
"""
from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .structures import iter_leaves, transpose_map, zip_map

__all__ = ["LossTerm", "StatisticsTerm", "LossTree", "reduce_loss_terms", "reduce_loss_trees", "criterion_loss_terms",
           "exact_loss_terms", "cross_entropy_terms", "valid_count", "PER_SAMPLE_MEAN_LOSSES"]

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


class StatisticsTerm(NamedTuple):
    """One additive term of a loss that is a function of statistics summed or concatenated over the whole batch.

    Attributes:
        statistics: this replica's statistics, a tuple of tensors (the same number, dtypes and trailing shapes on
            every replica).
        finish: ``finish(*combined_statistics) -> scalar tensor``, the term's value from the whole batch's
            statistics (the function is taken from the first replica; every replica must pass the same one).
        weight: coefficient of the finished term in the final loss (e.g. ``aux_weight``).
        combine: ``"sum"``: the replicas' statistics are summed elementwise; ``"cat"``: concatenated along
            dimension 0 in replica order (replica order is batch order, so this is the whole batch's tensor).

    Example:
        >>> ratio = lambda hits, total: hits.sum() / total.sum()
        >>> a = [StatisticsTerm((torch.tensor([1.0, 2.0]), torch.tensor([4.0, 4.0])), ratio, combine="cat")]
        >>> b = [StatisticsTerm((torch.tensor([3.0]), torch.tensor([2.0])), ratio, combine="cat")]
        >>> reduce_loss_terms([a, b])   # (1 + 2 + 3) / (4 + 4 + 2)
        tensor(0.6000)
    """

    statistics: Tuple[Tensor, ...]
    finish: Callable[..., Tensor]
    weight: float = 1.0
    combine: str = "sum"


def _combine_statistics(group: Sequence[StatisticsTerm], t: int, device: torch.device) -> Tensor:
    """The finished value of statistics term ``t`` from every replica's statistics."""
    modes = {term.combine for term in group}
    if len(modes) != 1 or not modes <= {"sum", "cat"}:
        raise ValueError(f"loss term {t}: combine must be 'sum' or 'cat' and the same on every replica, got "
                         f"{sorted(modes)}")
    sizes = {len(term.statistics) for term in group}
    if len(sizes) != 1:
        raise ValueError(f"loss term {t} has different numbers of statistics on different replicas: {sorted(sizes)}")
    combined = []
    for parts in zip(*(term.statistics for term in group)):
        parts = [part.to(device) for part in parts]
        combined.append(torch.cat(parts) if modes == {"cat"} else sum(parts[1:], parts[0]))
    return group[0].finish(*combined)


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
        A scalar tensor ``sum_t weight_t * sum_i total_it / sum_i count_it`` (``count=None`` terms are summed);
        a :class:`StatisticsTerm` contributes ``weight_t * finish(*combined statistics)``. Autograd flows back into
        every replica's ``total`` and statistics (and ``count`` where it is differentiable).

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
    if not per_replica_terms[0]:
        raise ValueError("a criterion returned no loss terms")
    first = next((term.total for term in per_replica_terms[0] if isinstance(term, LossTerm)), None)
    if first is None:  # statistics terms only: their finished value decides the dtype
        first = per_replica_terms[0][0].statistics[0]
    device = torch.device(device) if device is not None else first.device
    dtype = first.dtype
    loss = None
    for t, group in enumerate(zip(*per_replica_terms)):
        weights = {term.weight for term in group}
        if len(weights) != 1:
            raise ValueError(f"loss term {t} has different weights on different replicas: {sorted(weights)}")
        kinds = {type(term) for term in group}
        if len(kinds) != 1:
            raise ValueError(f"loss term {t} is a LossTerm on some replicas and a StatisticsTerm on others")
        if kinds == {StatisticsTerm}:
            value = group[0].weight * _combine_statistics(group, t, device)
            loss = value if loss is None else loss + value
            continue
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


class LossTree:
    """One replica's container (dict, tuple, namedtuple, ...) of scalar losses, as returned by a criterion without
    ``loss_terms``: ``tree`` is that container with every 0-dim tensor replaced by its loss terms (non-tensor values
    are kept). :func:`reduce_loss_trees` reduces the replicas' containers leaf by leaf.

    Attributes:
        tree: the container, its losses described as loss terms.
    """

    __slots__ = ("tree",)

    def __init__(self, tree: Any):
        self.tree = tree


class _LeafTerms:
    """The loss terms of one scalar loss of a :class:`LossTree` (a leaf for :func:`~.structures.zip_map`)."""

    __slots__ = ("terms",)

    def __init__(self, terms: list):
        self.terms = terms


def reduce_loss_trees(per_replica: Sequence[LossTree], device: Optional[Union[torch.device, str]] = None) -> Any:
    """Reduce every replica's :class:`LossTree` into one container shaped like the criterion's result.

    Args:
        per_replica: one :class:`LossTree` per replica, all with the same structure.
        device: where the losses live (default: the device of each loss's first replica).

    Returns:
        The container, each loss reduced by :func:`reduce_loss_terms` over the replicas; a non-tensor value is kept
        when every replica returned the same one, otherwise it becomes the list of the replicas' values.

    Raises:
        ValueError: a place holds a loss on some replicas and a plain value on others.
    """
    def combine(values: List[Any]) -> Any:
        losses = [isinstance(v, _LeafTerms) for v in values]
        if all(losses):
            return reduce_loss_terms([v.terms for v in values], device)
        if any(losses):
            raise ValueError("a criterion returned a scalar loss on some replicas and a plain value on others at "
                             "the same place")
        return values[0] if all(v == values[0] for v in values[1:]) else list(values)

    return zip_map(combine, [replica.tree for replica in per_replica])


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
        A list of :class:`LossTerm`; a :class:`LossTree` when the criterion returns a container (dict, tuple, ...)
        of scalar losses; or — when the criterion returns a non-scalar (``reduction='none'``) — that tensor
        unchanged, to be gathered by the caller.
    """
    return exact_loss_terms(criterion, args, kwargs, batch_size)[0]


def exact_loss_terms(criterion: Callable[..., Any], args: Sequence[Any], kwargs: dict,
                     batch_size: int) -> Tuple[Union[list, Tensor], bool]:
    """:func:`criterion_loss_terms` and whether its terms reduce to the whole-batch value exactly.

    Exact: the protocol (``loss_terms``), ``nn.CrossEntropyLoss`` / ``nn.NLLLoss`` (sums over the weighted number of
    non-ignored targets), ``reduction='sum'``, a non-scalar result (gathered), and the batch-share weighting of
    :data:`PER_SAMPLE_MEAN_LOSSES`. Not exact: the batch-share weighting of any other scalar loss (a plain function,
    an unknown module), which equals the whole-batch loss only when that loss is a mean over samples. A container
    (dict, tuple, ...) of scalar losses becomes a :class:`LossTree`, each loss described as a scalar result is, exact
    when every one of them is.

    Returns:
        ``(terms_or_tensor, exact)``.
    """
    if hasattr(criterion, "loss_terms"):
        return list(criterion.loss_terms(*args, **kwargs)), True
    pair = _input_target(args, kwargs)
    if _is_torch_loss(criterion, (nn.CrossEntropyLoss, nn.NLLLoss)) and criterion.reduction in ("mean", "sum") \
            and pair is not None and isinstance(pair[0], Tensor):
        return cross_entropy_terms(criterion, *pair), True
    loss = criterion(*args, **kwargs)
    if _is_scalar_container(loss):  # every scalar loss is described as one alone would be
        exact: List[bool] = []

        def describe(leaf: Any) -> List[Any]:
            if not isinstance(leaf, Tensor):
                return [leaf]
            terms, leaf_exact = _scalar_terms(criterion, leaf, batch_size)
            exact.append(leaf_exact)
            return [_LeafTerms(terms)]

        return LossTree(transpose_map(describe, loss, 1)[0]), all(exact)
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        return loss, True
    return _scalar_terms(criterion, loss, batch_size)


def _scalar_terms(criterion: Any, loss: Tensor, batch_size: int) -> Tuple[list, bool]:
    """The terms of one replica's scalar ``loss`` that is not cross-entropy: summed with ``reduction='sum'``, else
    weighted by the replica's share of the batch (exact for :data:`PER_SAMPLE_MEAN_LOSSES` only)."""
    if getattr(criterion, "reduction", None) == "sum":
        return [LossTerm(loss, None)], True
    return [LossTerm(loss * batch_size, batch_size)], _is_torch_loss(criterion, PER_SAMPLE_MEAN_LOSSES)


def _is_scalar_container(loss: Any) -> bool:
    """``loss`` is a container (dict, tuple, ...) holding tensors, every one of them 0-dim."""
    if isinstance(loss, Tensor):
        return False
    tensors = [leaf for _, leaf in iter_leaves(loss) if isinstance(leaf, Tensor)]
    return bool(tensors) and all(t.dim() == 0 for t in tensors)


def _input_target(args: Sequence[Any], kwargs: dict) -> Optional[Tuple[Any, Any]]:
    """``(input, target)`` of a call of a torch loss, given by position or by torch's names (``None``: another
    call)."""
    rest = ("input", "target")[len(args):]
    if len(args) > 2 or set(kwargs) != set(rest):
        return None
    return tuple(args) + tuple(kwargs[name] for name in rest)
