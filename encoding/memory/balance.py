"""The automatic split: per-device batch shares that minimise the heaviest device's simulated peak memory.

:func:`plan_split` searches the integer split of a batch given device 0's and the other devices' cost curves;
:func:`strategy_peaks` gives a strategy's split and peaks; :func:`max_batch` finds the largest batch that fits a
memory limit; :class:`MemoryBalancer` plans :class:`~encoding.parallel.DataParallelModel`'s split
(``balance="memory"``, registered here with :func:`encoding.parallel.planners.register_balancer`) by simulating the
wrapped module on fake tensors (:mod:`encoding.memory.simulate`). See ``docs/memory.md``.
"""
from __future__ import annotations

import copy
import functools
import math
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..parallel.planners import register_balancer
from ..parallel.scatter_gather import batch_size_of, get_split_sizes
from ..parallel.sample_lists import resolve_sample_lists
from ..parallel.structures import PerSample, iter_leaves, transpose_map
from .fakes import new_fake_mode
from .program import DeviceProgram, StepSpec, default_optimizer, tensor_leaves
from .search import confirm_boundary, largest_fitting
from .simulate import Simulator

__all__ = ["plan_split", "strategy_peaks", "max_batch", "MemoryBalancer"]


def plan_split(source_cost: Callable[[int], float], other_cost: Callable[[int], float], batch: int,
               num_devices: int) -> List[int]:
    """The integer split of ``batch`` over ``num_devices`` that minimises the heaviest device's cost.

    Device 0 has its own cost curve (it also holds the module, optimizer state and reduced gradients); the other
    devices share one. Both must be non-decreasing in the number of samples. For a given ``b0`` on device 0, the
    rest is best spread evenly (heaviest: ``ceil((batch - b0) / (num_devices - 1))``), so the search is over
    ``b0``: a search outward from the even split for where device 0 overtakes the others (:func:`_first_true`), plus
    the even split as a candidate. Ties go to the split closest to even.

    Args:
        source_cost: device 0's cost of ``b`` samples.
        other_cost: any other device's cost of ``b`` samples (``0`` samples must cost ``0`` or its fixed cost).
        batch: the total batch.
        num_devices: devices available.

    Returns:
        Samples per device (``num_devices`` entries, zeros allowed, device 0 first).
    """
    if num_devices < 1 or batch < 1:
        raise ValueError(f"plan_split needs a batch >= 1 and num_devices >= 1, got {batch} and {num_devices}")
    if num_devices == 1:
        return [batch]
    even = _even_split(batch, num_devices)

    def rest(b0: int) -> List[int]:
        return [b0] + get_split_sizes(batch - b0, num_devices - 1) if b0 < batch else [batch]

    def others(b0: int) -> float:  # the heaviest other device when device 0 takes b0
        return other_cost(math.ceil((batch - b0) / (num_devices - 1)))

    def heaviest(b0: int) -> float:
        return max(source_cost(b0), others(b0))

    lo = _first_true(lambda b0: source_cost(b0) >= others(b0), even[0], batch)  # device 0 as heavy as the others
    candidates = {even[0], lo, max(lo - 1, 0)}
    best = min(sorted(candidates), key=lambda b0: (heaviest(b0), abs(b0 - even[0])))
    split = rest(best)
    return split + [0] * (num_devices - len(split))


def _first_true(test: Callable[[int], bool], start: int, end: int) -> int:
    """The smallest ``b`` in ``[0, end]`` with ``test(b)`` (``end`` where none is), for a ``test`` false then true:
    strides doubling away from ``start`` bracket it, a bisection finds it. The answer lies near ``start`` (the even
    split), so a large batch costs about ``2 log2`` of the distance evaluations (simulations), not ``log2(end)``."""
    step = 1
    if test(start):
        hi = start
        while hi > 0 and test(max(0, hi - step)):
            hi, step = max(0, hi - step), step * 2
        lo = max(0, hi - step) + 1 if hi > 0 else 0
    else:
        lo = min(start + 1, end)
        while lo + step - 1 < end and not test(lo + step - 1):
            lo, step = lo + step, step * 2
        hi = min(end, lo + step - 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if test(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _even_split(batch: int, num_devices: int) -> List[int]:
    """The even split, one entry per device (zeros when the batch has fewer samples than devices)."""
    split = get_split_sizes(batch, num_devices)
    return split + [0] * (num_devices - len(split))


def _strategy_split(simulator: Simulator, strategy: str, batch: int, num_devices: int) -> List[int]:
    if strategy != "balanced-auto":
        return _even_split(batch, num_devices)
    def cost(source: bool, b: int) -> float:
        replicas = (1 if b else 0) + min(batch - b, num_devices - 1) if source else 1
        return simulator.peak(DeviceProgram("balanced", b, batch, source=source, replicas=replicas))
    return plan_split(functools.partial(cost, True), functools.partial(cost, False), batch, num_devices)


def strategy_peaks(simulator: Simulator, strategy: str, batch: int, num_devices: int) -> Tuple[List[int], List[int]]:
    """``(split, peak bytes per device)`` of ``strategy`` for a total ``batch`` on ``num_devices``."""
    split = _strategy_split(simulator, strategy, batch, num_devices)
    return split, simulator.peaks(strategy, split)


#: Where :func:`max_batch` gives up doubling: no device holds this many samples, so a limit that fits them is an error.
SEARCH_LIMIT = 2 ** 32


def max_batch(simulator: Simulator, strategy: str, num_devices: int, limit_bytes: int,
              upper: Optional[int] = None) -> int:
    """The largest total batch whose heaviest device stays within ``limit_bytes`` (0 when none fits).

    The search of the advice (:func:`~encoding.memory.advice.largest_fitting`), bounded whatever the limit: the
    heaviest device's peak is close to affine in the samples per device, so a few simulations of the batches
    ``share * num_devices`` give the largest such batch that fits (confirmed: the next one does not), then a
    bisection over the at most ``num_devices`` batches between it and the next finds the answer. Fake tensors cost
    the same at any size, so a huge limit costs no more simulations than a small one.

    Args:
        upper: stop the search there (the answer is then at most ``upper``: a caller that sets it must say so
            where it reports the answer); default none.

    Raises:
        ValueError: ``limit_bytes`` holds more than ``SEARCH_LIMIT`` (2**32) samples.
    """
    cap = SEARCH_LIMIT if upper is None else upper

    def heaviest(batch: int) -> int:
        if batch > SEARCH_LIMIT:
            raise ValueError(f"max_batch: more than {SEARCH_LIMIT} samples fit in {limit_bytes} bytes per device; "
                             "the limit is beyond any batch")
        return max(strategy_peaks(simulator, strategy, batch, num_devices)[1])

    def fits(batch: int) -> bool:
        return batch <= cap and heaviest(batch) <= limit_bytes

    def per_device(share: int) -> int:  # the even batch of `share` samples per device
        return heaviest(share * num_devices)

    if strategy == "balanced-auto" and num_devices > 1:
        return min(cap, _auto_max_batch(simulator, num_devices, limit_bytes))
    share = confirm_boundary(per_device, largest_fitting(per_device, 1, limit_bytes), limit_bytes)
    share = min(share, cap // num_devices)
    low, high = share * num_devices, (share + 1) * num_devices
    while fits(high):  # an uneven split (balanced-auto) may fit more: gallop, doubling the step
        low, high = high, high + 2 * (high - low)
    if not low and not fits(1):
        return 0
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _auto_max_batch(simulator: Simulator, num_devices: int, limit_bytes: int) -> int:
    """``balanced-auto``'s largest batch: :func:`plan_split` finds a split that fits whenever one exists, and one
    exists for ``b0 + (num_devices - 1) * b`` samples exactly when device 0 fits ``b0`` and any other device ``b``:
    the largest of each (confirmed: one more does not fit), not a search over batches (each of which would plan a
    split)."""
    def cost(source: bool, share: int) -> int:  # as plan_split sees a device of a batch of num_devices or more
        return simulator.peak(DeviceProgram("balanced", share, share, source, num_devices if source else 1))

    if cost(True, 0) > limit_bytes:  # device 0 holds the module and its optimizer state even without samples
        return 0
    shares = []
    for source in (True, False):
        def peak(share: int, source: bool = source) -> int:
            return cost(source, share)
        shares.append(confirm_boundary(peak, largest_fitting(peak, 1, limit_bytes), limit_bytes))
    return shares[0] + (num_devices - 1) * shares[1]


# ------------------------------------------------------------------------------------------------ DataParallelModel
def _fake_copy(module: nn.Module, fake_mode: Any) -> nn.Module:
    """A deep copy of ``module`` whose parameters, buffers and other tensor attributes (e.g. a detector's anchors
    held in a list) are fake tensors of the same shapes."""
    memo: Dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(fake_mode.from_tensor(p.detach()), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = fake_mode.from_tensor(b)
    for sub in module.modules():
        for _, leaf in iter_leaves(list(sub.__dict__.values())):
            if isinstance(leaf, Tensor) and id(leaf) not in memo:
                memo[id(leaf)] = fake_mode.from_tensor(leaf)
    return copy.deepcopy(module, memo)


def _segmentation_loss(output: Any, target: Tensor) -> Tensor:
    """Default loss of :class:`MemoryBalancer`: cross-entropy of every ``B x C x ...`` output against ``target``,
    plus the sum of the other floating outputs."""
    loss = None
    for leaf in tensor_leaves(output):
        term = F.cross_entropy(leaf, target) if leaf.dim() == target.dim() + 1 else leaf.float().sum()
        loss = term if loss is None else loss + term
    return loss


class _KeyedLoss:
    """``criterion(output[output_key], target)`` plus ``aux_weight * criterion(output[aux_key], target)``."""

    def __init__(self, criterion: Callable[..., Any], output_key: Hashable, aux_key: Hashable,
                 aux_weight: Optional[float]) -> None:
        self.criterion, self.output_key, self.aux_key, self.aux_weight = criterion, output_key, aux_key, aux_weight

    def __call__(self, output: Any, target: Any) -> Tensor:
        loss = self.criterion(output[self.output_key], target)
        return loss + self.aux_weight * self.criterion(output[self.aux_key], target) if self.aux_weight else loss


def _narrow(tree: Any, share: int, dim: int) -> Any:
    """``tree`` with every batched tensor resized to ``share`` samples along ``dim`` (new storage, like a scatter)."""
    def leaf(value: Any) -> List[Any]:
        if isinstance(value, Tensor) and value.dim() > dim:
            shape = list(value.shape)
            shape[dim] = share
            return [value.new_zeros(shape)]
        return [value]
    return transpose_map(leaf, tree, 1)[0]


class MemoryBalancer:
    """Plans :class:`~encoding.parallel.DataParallelModel`'s split from simulated per-device peak memory.

    On the first training batch of each size (and input shapes) it simulates the ``balanced`` device programs of the
    wrapped module on fake tensors (nothing is allocated, no kernel runs) and returns the split from
    :func:`plan_split`. ``DataParallelModel(module, device_ids, balance="memory")`` uses the defaults.

    Evaluation and inference batches (gradients disabled — ``torch.no_grad()``, ``torch.inference_mode()`` — or
    the module in eval mode) run forward only: no gradients, no optimizer state, no loss on device 0, and every
    device holds a copy of the parameters (device 0's replica aliases the module) and its own share's activations.
    Device 0 carries nothing extra, so the memory-balanced split of a forward pass is the even split, which
    :meth:`plan` returns for them (of any size, a last partial batch included) without simulating.

    Args:
        criterion: the loss computed on each device (default: cross-entropy of every ``B x C x ...`` output against
            a target of the input's batch and spatial size, the other floating outputs summed).
        make_target: ``(args, kwargs) of share samples -> target`` (default: int64 zeros of the first input's batch
            and spatial size).
        optimizer: ``params -> optimizer`` whose state device 0 holds (default: SGD with momentum).
        round_to: allocation granularity (default 512 on CUDA devices, else 1).
        output_key / aux_weight / aux_key: as :class:`~encoding.parallel.DataParallelCriterion`'s: the criterion
            sees ``output[output_key]`` plus ``aux_weight`` times its value on ``output[aux_key]``. A
            ``DataParallelCriterion`` given as ``criterion`` brings its own.

    Example:
        >>> model = DataParallelModel(net, ["cpu"] * 3, balance=MemoryBalancer(criterion))  # doctest: +SKIP
    """

    def __init__(self, criterion: Optional[Callable[..., Any]] = None,
                 make_target: Optional[Callable[[tuple, dict], Any]] = None,
                 optimizer: Callable[[List[Tensor]], torch.optim.Optimizer] = default_optimizer,
                 round_to: Optional[int] = None, *, output_key: Optional[Hashable] = None,
                 aux_weight: Optional[float] = None, aux_key: Hashable = "aux") -> None:
        if hasattr(criterion, "output_key") and hasattr(criterion, "criterion"):  # a DataParallelCriterion
            output_key, aux_weight, aux_key = criterion.output_key, criterion.aux_weight, criterion.aux_key
            criterion = criterion.criterion
        if aux_weight and output_key is None:
            raise ValueError("MemoryBalancer: aux_weight needs output_key, the key of the main output")
        if output_key is not None:
            criterion = _KeyedLoss(criterion if criterion is not None else F.cross_entropy, output_key, aux_key,
                                   aux_weight)
        self.criterion = criterion if criterion is not None else _segmentation_loss
        self.make_target = make_target if make_target is not None else _default_target
        self.optimizer = optimizer
        self.round_to = round_to
        self._plans: Dict[tuple, List[int]] = {}

    def plan(self, module: nn.Module, inputs: tuple, kwargs: dict, device_ids: Sequence[torch.device],
             dim: int = 0) -> List[int]:
        """Samples per device for this call (cached per batch size, device count and input shapes); the even split
        for a forward-only call (gradients disabled, or ``module`` in eval mode)."""
        batch = batch_size_of((inputs, kwargs), dim, name="args")
        if not (torch.is_grad_enabled() and module.training):
            return _even_split(batch, len(device_ids))
        _refuse_sample_lists(inputs, kwargs, dim)
        shapes = tuple((path, tuple(v.shape)) for path, v in iter_leaves((inputs, kwargs)) if isinstance(v, Tensor))
        key = (batch, len(device_ids), shapes)
        if key not in self._plans:
            self._plans[key] = self._plan(module, inputs, kwargs, device_ids, dim, batch)
        return self._plans[key]

    def _plan(self, module: nn.Module, inputs: tuple, kwargs: dict, device_ids: Sequence[torch.device], dim: int,
              batch: int) -> List[int]:
        fake_mode = new_fake_mode()
        with fake_mode:
            template = transpose_map(lambda v: [fake_mode.from_tensor(v.detach()) if isinstance(v, Tensor) else v],
                                     (tuple(inputs), dict(kwargs)), 1)[0]

        def make_inputs(share: int) -> Tuple[tuple, dict]:
            return _narrow(template, share, dim)

        spec = StepSpec(build_model=lambda: _fake_copy(module, fake_mode), make_inputs=make_inputs,
                        make_target=lambda share: self.make_target(*make_inputs(share)),
                        criterion=self.criterion, optimizer=self.optimizer)
        round_to = self.round_to or (512 if device_ids[0].type == "cuda" else 1)
        simulator = Simulator(spec, round_to, fake_mode)
        return _strategy_split(simulator, "balanced-auto", batch, len(device_ids))


def _refuse_sample_lists(inputs: tuple, kwargs: dict, dim: int) -> None:
    """A training call with lists of samples (``PerSample``, a detector's images and target dicts) is refused: the
    simulation narrows batched tensors to a share, while a share of such a list holds particular samples of their
    own sizes (and a detector's memory follows its detections, which fake tensors cannot compute)."""
    resolved = resolve_sample_lists((tuple(inputs), dict(kwargs)), dim, "args")
    lists = [path for part, name in zip(resolved, ("args", "kwargs")) for path, leaf in iter_leaves(part, name)
             if isinstance(leaf, PerSample)]
    if lists:
        raise ValueError(f"balance='memory' cannot plan a call with lists of samples ({', '.join(lists)}): the "
                         "memory of each share depends on which samples it gets; give chunk_sizes=[...] instead")


def _default_target(args: tuple, kwargs: dict) -> Tensor:
    first = next(v for _, v in iter_leaves((args, kwargs)) if isinstance(v, Tensor))
    return torch.zeros((first.shape[0],) + tuple(first.shape[2:]), dtype=torch.long, device=first.device)


register_balancer("memory", MemoryBalancer)
