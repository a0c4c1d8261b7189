"""``DataParallelCriterion``: the loss computed where each replica's output lives, reduced to the whole-batch value.

How each criterion is reduced is :mod:`encoding.parallel.reduction`'s business; this module splits the targets like the
model's batch, runs the criterion per replica, picks the main (and auxiliary) output of dict or tuple outputs
(``output_key`` / ``aux_weight``), warns once when a criterion cannot be reduced exactly, and falls back to the
whole batch where a replica's loss is undefined.
"""
from __future__ import annotations

import inspect
import itertools
import math
import numbers
import warnings

from collections.abc import Mapping
from typing import Any, Callable, Hashable, List, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.nn.modules.loss import _Loss

from .data_parallel import _DataParallelBase
from .devices import DeviceLike
from .parallel_apply import parallel_apply
from .reduction import LossTree, exact_loss_terms, reduce_loss_terms, reduce_loss_trees
from .replicate import replicate
from .scatter_gather import batch_size_of, gather, scatter_kwargs, to_device
from .structures import device_of, iter_leaves

__all__ = ["DataParallelCriterion", "InexactReductionWarning"]


class InexactReductionWarning(UserWarning):
    """A criterion's per-replica losses are combined by batch share, which may differ from the whole-batch loss."""


class DataParallelCriterion(_DataParallelBase):
    """Compute a loss on every device from :class:`~encoding.parallel.DataParallelModel`'s ungathered outputs and
    reduce it exactly.

    ``forward(outputs, *targets, **kwargs)`` splits the targets with **exactly the split sizes the model used**
    (from :class:`~encoding.parallel.ReplicaOutputs`, or from each output's size along ``dim``), moves each part to
    its output's device, evaluates the criterion there (in parallel), and combines the results with the
    exact-reduction protocol (:mod:`encoding.parallel.reduction`): the result equals the criterion on the whole
    batch, also for uneven splits and uneven ``ignore_index`` masks. PyTorch-Encoding's unweighted mean of
    per-device losses is biased; this is not.

    Exact without any knowledge of the protocol: torch's ``CrossEntropyLoss`` / ``NLLLoss`` (``ignore_index``,
    ``weight``, ``label_smoothing``), the per-sample means of
    :data:`~encoding.parallel.reduction.PER_SAMPLE_MEAN_LOSSES` (``MSELoss``, ``L1Loss``, ``BCEWithLogitsLoss``, ...),
    any ``reduction='sum'`` and criteria with a ``loss_terms`` method. Any other scalar loss (a plain function, a
    lambda, an unknown module) is weighted by each replica's share of the batch, which is exact only for a mean over
    samples: the wrapper says so once (:class:`InexactReductionWarning`), and where a replica's loss is not finite
    (e.g. all its targets ignored) the loss is computed on the whole batch instead (gathered onto
    ``output_device``), so a defined whole-batch loss is never NaN. A criterion returning a dict or tuple of scalar
    losses gets the same, loss by loss, and the result has the criterion's container shape.

    Models returning a dict or tuple (torchvision's ``{"out", "aux"}``): ``output_key`` picks the output the
    criterion receives, and ``aux_weight`` adds ``aux_weight * criterion(output[aux_key], target)``, as
    torchvision's reference training does with ``aux_weight=0.5``; both terms are reduced exactly.

    The criterion receives ``(output_i, *targets_i, **kwargs_i)``, where ``output_i`` is whatever the model returned
    (tensor, tuple, dict) or its ``output_key`` entry. A criterion that returns a non-scalar (``reduction='none'``)
    is gathered along ``dim``.

    Args:
        criterion: an ``nn.Module`` (replicated per device, so buffers such as class weights follow) or a callable.
        device_ids: as for :class:`~encoding.parallel.DataParallelModel` (only consulted when an output holds no
            tensor).
        output_device: where the reduced loss lives (default: ``device_ids[0]``, else the first output's device).
        dim: the batch dimension of the targets (and of outputs to gather); ``None`` (default): the model's
            (the ``dim`` a :class:`~encoding.parallel.ReplicaOutputs` carries), else 0. Give it where the targets'
            batch dimension is not the outputs' (CTC: outputs ``T x N x C`` split along 1, targets ``N x S``: 0).
        output_key: the key (or index) of the model output the criterion receives, e.g. ``"out"``; ``None``: the
            whole output.
        aux_weight: with ``output_key``, the weight of the auxiliary loss on ``output[aux_key]`` (``None`` or ``0``:
            no auxiliary loss).
        aux_key: the key (or index) of the auxiliary output (default ``"aux"``, torchvision's).

    Raises:
        TypeError: ``criterion`` is not callable, ``dim`` is not an int.
        ValueError: ``aux_weight`` is negative, not finite, or given without ``output_key``; at call time, a torch
            loss module receives a dict or tuple output without ``output_key`` (the message names the keys), or the
            output lacks ``output_key`` / ``aux_key``.

    Example:
        >>> model = DataParallelModel(nn.Linear(4, 3), device_ids=["cpu"] * 3)
        >>> criterion = DataParallelCriterion(nn.CrossEntropyLoss(), device_ids=["cpu"] * 3)
        >>> loss = criterion(model(torch.randn(7, 4)), torch.randint(0, 3, (7,)))
        >>> loss.dim()
        0
    """

    def __init__(self, criterion: Callable[..., Any], device_ids: Optional[Sequence[DeviceLike]] = None,
                 output_device: Optional[DeviceLike] = None, dim: Optional[int] = None, *,
                 output_key: Optional[Hashable] = None,
                 aux_weight: Optional[float] = None, aux_key: Hashable = "aux"):
        if not callable(criterion):
            raise TypeError(f"DataParallelCriterion: criterion must be a module or a callable, got "
                            f"{type(criterion).__name__}")
        if aux_weight is not None:
            if isinstance(aux_weight, bool) or not isinstance(aux_weight, numbers.Real) \
                    or not math.isfinite(aux_weight) or aux_weight < 0:
                raise ValueError(f"DataParallelCriterion: aux_weight must be a finite number >= 0, got {aux_weight!r}")
            if output_key is None:
                raise ValueError("DataParallelCriterion: aux_weight needs output_key, the key of the main output "
                                 "(e.g. output_key='out', aux_weight=0.5 for torchvision's {'out', 'aux'})")
            if getattr(criterion, "reduction", None) == "none":
                raise ValueError("DataParallelCriterion: aux_weight needs a scalar loss, the criterion has "
                                 "reduction='none'")
        super().__init__(device_ids, output_device, 0 if dim is None else dim)
        self.dim: Optional[int] = dim  # None: the model's
        self.criterion = criterion
        self.output_key, self.aux_weight, self.aux_key = output_key, aux_weight or None, aux_key
        self._warned = False

    @property
    def module(self) -> Callable[..., Any]:
        """The wrapped criterion (PyTorch-Encoding name)."""
        return self.criterion

    def extra_repr(self) -> str:
        keys = f", output_key={self.output_key!r}" if self.output_key is not None else ""
        if self.aux_weight:
            keys += f", aux_key={self.aux_key!r}, aux_weight={self.aux_weight}"
        return super().extra_repr() + keys

    def forward(self, outputs: Any, *targets: Any, **kwargs: Any) -> Any:
        outputs = outputs if isinstance(outputs, list) else [outputs]
        if not outputs:
            raise ValueError("DataParallelCriterion got an empty list of outputs")
        self._check_output(outputs[0])
        apart = self.output_key is None and isinstance(outputs[0], (tuple, list)) and \
            takes_outputs_apart(self.criterion, len(outputs[0]), len(targets), kwargs)  # PE's call
        if len(outputs) == 1:
            targets, kwargs = to_device((targets, kwargs), self._replica_device(outputs[0], 0))
            return self._whole_batch(outputs[0], targets, kwargs, apart)
        dim = self.dim if self.dim is not None else getattr(outputs, "dim", 0)  # unset: split like the model
        sizes = self._split_sizes(outputs, dim)
        devices = [self._replica_device(o, i) for i, o in enumerate(outputs)]
        target_parts, kw_parts, _ = scatter_kwargs(targets, kwargs, devices, dim, split_sizes=sizes)
        criteria = self._replicate_criterion(devices)
        calls = [_TermsCall(c, s, self.output_key, self.aux_key, self.aux_weight, apart)
                 for c, s in zip(criteria, sizes)]
        results = parallel_apply(calls, [(o,) + tuple(t) for o, t in zip(outputs, target_parts)], kw_parts, devices)
        output_device = self.output_device if self.output_device is not None else devices[0]
        if all(isinstance(r, LossTree) for r in results):  # a dict or tuple of scalar losses, each reduced as one
            loss = reduce_loss_trees(results, output_device)
        elif not all(isinstance(r, list) for r in results):
            return gather(results, output_device, dim)
        else:
            loss = reduce_loss_terms(results, output_device)
        if all(call.exact for call in calls):
            return loss
        self._warn_inexact(outputs[0])
        if _finite(loss):
            return loss
        # a replica without a defined loss (e.g. all its targets ignored): the whole batch defines it
        targets, kwargs = to_device((targets, kwargs), output_device)
        return self._whole_batch(gather(outputs, output_device, dim), targets, kwargs, apart)

    def _whole_batch(self, output: Any, targets: tuple, kwargs: dict, apart: bool) -> Any:
        """The criterion on one output (the whole batch, or a single replica's), ``output_key`` / ``aux_weight``
        applied; ``apart``: a tuple output given as separate arguments (:func:`takes_outputs_apart`)."""
        if self.output_key is None:
            return self.criterion(*(tuple(output) if apart else (output,)), *targets, **kwargs)
        loss = self.criterion(output[self.output_key], *targets, **kwargs)
        if self.aux_weight:
            loss = loss + self.aux_weight * self.criterion(output[self.aux_key], *targets, **kwargs)
        return loss

    def _check_output(self, output: Any) -> None:
        """Clear errors, in the caller's thread, for outputs the criterion cannot take."""
        keys = list(output) if isinstance(output, Mapping) else None
        what = (f"a dict with keys {keys}" if keys is not None else
                f"a {type(output).__name__} of {len(output)}" if isinstance(output, (tuple, list)) else None)
        if self.output_key is None:
            if what is not None and _torch_forward(self.criterion):
                hint = (f"output_key={keys[0]!r}" if keys else "output_key=0") + (
                    f" (and aux_weight=0.5 to add the loss of {'aux'!r})" if keys and "aux" in keys else "")
                raise ValueError(f"DataParallelCriterion: {type(self.criterion).__name__} takes one tensor but the "
                                 f"model returns {what}: pass {hint}")
            return
        if isinstance(output, Tensor):  # output[0] would silently be the first sample
            raise ValueError(f"DataParallelCriterion: output_key={self.output_key!r} needs a dict or tuple output, the "
                             f"model returns a tensor: leave output_key unset")
        for name, key in (("output_key", self.output_key), ("aux_key", self.aux_key if self.aux_weight else None)):
            if key is None:
                continue
            try:
                output[key]
            except (KeyError, IndexError, TypeError):
                raise ValueError(f"DataParallelCriterion: {name}={key!r} is not in the model's output, which is "
                                 f"{what or 'a ' + type(output).__name__}") from None

    def _warn_inexact(self, output: Any) -> None:
        if self._warned:
            return
        self._warned = True
        name = getattr(self.criterion, "__name__", None) or type(self.criterion).__name__
        warnings.warn(
            f"DataParallelCriterion cannot reduce {name} exactly: each replica's loss is weighted by its share of "
            f"the batch, which is the whole-batch loss only for a mean over samples. {_inexact_advice(output)}",
            InexactReductionWarning, stacklevel=5)

    def _replica_device(self, output: Any, index: int) -> torch.device:
        device = device_of(output)
        if device is not None:
            return device
        if index < len(self.device_ids):
            return self.device_ids[index]
        raise ValueError(f"output {index} holds no tensor and device_ids has no entry {index}")

    def _split_sizes(self, outputs: Sequence[Any], dim: int) -> List[int]:
        sizes = getattr(outputs, "split_sizes", None)
        if sizes is not None and None not in sizes:
            return list(sizes)
        inferred = [batch_size_of(o, dim, name=f"outputs[{i}]") for i, o in enumerate(outputs)]
        if None in inferred:
            raise ValueError("DataParallelCriterion cannot tell how many samples each output holds: pass the "
                             "ReplicaOutputs that DataParallelModel returned, or outputs with a batch dimension")
        return inferred

    def _replicate_criterion(self, devices: List[torch.device]) -> List[Callable[..., Any]]:
        criterion = self.criterion
        if isinstance(criterion, nn.Module) and next(itertools.chain(criterion.parameters(), criterion.buffers()),
                                                     None) is not None:
            return replicate(criterion, devices)
        return [criterion] * len(devices)


def _inexact_advice(output: Any) -> str:
    """What to do about an inexact reduction, for the kind of output the criterion received."""
    protocol = "docs/parallel.md, 'The exact-reduction protocol'"
    values = list(output.values()) if isinstance(output, Mapping) else None
    if values and all(isinstance(v, Tensor) and v.dim() == 0 for v in values):
        return ("The model computes its own losses (a dict of scalars, e.g. a torchvision detector in training "
                "mode): each replica's values are means over its own samples, boxes or anchors, so their share-"
                "weighted mean is what DistributedDataParallel would train on, not the whole-batch value. For the "
                "exact value, have the model return sums and counts and give the criterion a loss_terms method "
                f"({protocol}).")
    if isinstance(output, Mapping) or (isinstance(output, Tensor) and output.dim() >= 3):
        return ("For a segmentation output the exact loss comes from a torch loss module, e.g. "
                "DataParallelCriterion(nn.CrossEntropyLoss(ignore_index=255), output_key='out', aux_weight=0.5) for "
                f"a model returning {{'out', 'aux'}}; or give the criterion a loss_terms method ({protocol}).")
    return ("Pass a torch loss module (nn.CrossEntropyLoss, nn.MSELoss, nn.BCEWithLogitsLoss, ...: reduced exactly, "
            f"class weights and ignore_index included) or give the criterion a loss_terms method ({protocol}).")


def _torch_forward(criterion: Any) -> bool:
    """``criterion`` is a torch loss module running torch's own ``forward`` (which takes a tensor)."""
    return isinstance(criterion, _Loss) and getattr(type(criterion).forward, "__module__", "") == _Loss.__module__ \
        and not hasattr(criterion, "loss_terms")


def takes_outputs_apart(criterion: Any, outputs: int, targets: int, kwargs: Mapping[str, Any]) -> bool:
    """Whether ``criterion`` takes a model's tuple of ``outputs`` as separate arguments, as PyTorch-Encoding's
    ``DataParallelCriterion`` gave them (``criterion(*output, *targets)``; its users' losses, DANet's
    ``SegmentationMultiLosses``, take ``forward(self, *inputs)``), rather than as one (``criterion(output,
    *targets)``, this package's call): what its signature binds. Both bind: apart only for ``*inputs``. A criterion
    with ``loss_terms`` (the protocol) or whose signature cannot be read takes the tuple whole."""
    if hasattr(criterion, "loss_terms"):
        return False
    try:
        signature = inspect.signature(criterion.forward if isinstance(criterion, nn.Module) else criterion)
    except (TypeError, ValueError):
        return False

    def binds(count: int) -> bool:
        try:
            signature.bind(*[None] * count, **kwargs)
            return True
        except TypeError:
            return False

    whole, apart = binds(1 + targets), binds(outputs + targets)
    if whole != apart:
        return apart
    return apart and any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())


def _finite(loss: Any) -> bool:
    """Whether every tensor of ``loss`` (a tensor or a container of them) is finite; fake and meta tensors (the
    memory simulator) count as finite."""
    from torch._subclasses.fake_tensor import is_fake
    tensors = (leaf for _, leaf in iter_leaves(loss) if isinstance(leaf, Tensor))
    return all(t.is_meta or is_fake(t) or bool(torch.isfinite(t).all()) for t in tensors)


class _TermsCall:
    """Evaluate one replica's criterion as loss terms (see :func:`~encoding.parallel.reduction.exact_loss_terms`),
    the ``output_key`` entry as the main output and ``aux_weight`` times the ``aux_key`` entry's terms added."""

    def __init__(self, criterion: Callable[..., Any], batch_size: int, output_key: Optional[Hashable],
                 aux_key: Hashable, aux_weight: Optional[float], apart: bool = False):
        self.criterion, self.batch_size = criterion, batch_size
        self.output_key, self.aux_key, self.aux_weight = output_key, aux_key, aux_weight
        self.apart, self.exact = apart, True  # apart: the tuple output given as separate arguments

    def __call__(self, output: Any, *targets: Any, **kwargs: Any) -> Any:
        main = (tuple(output) if self.apart else (output,)) if self.output_key is None else (output[self.output_key],)
        result, self.exact = exact_loss_terms(self.criterion, main + targets, kwargs, self.batch_size)
        if not self.aux_weight:
            return result
        aux, aux_exact = exact_loss_terms(self.criterion, (output[self.aux_key],) + targets, kwargs, self.batch_size)
        if not isinstance(result, list) or not isinstance(aux, list):
            raise ValueError("DataParallelCriterion: aux_weight needs a criterion that returns a scalar loss")
        self.exact = self.exact and aux_exact
        return result + [term._replace(weight=term.weight * self.aux_weight) for term in aux]
