"""Per-device memory of a training step: a simulator on fake tensors, and real measurements to check it against.

What one device holds during a steady-state training step (forward, loss, backward, SGD-momentum step, after one
warm-up step) depends on the strategy:

* ``gather`` (``torch.nn.DataParallel``): device 0 holds the module's parameters, buffers and optimizer state,
  replica 0 (aliasing the parameters), its share's activations, the **gathered whole-batch outputs**, the
  whole-batch loss and its gradients, and at the end of backward replica 0's gradients beside the reduced sums.
  Every other device holds a broadcast replica, its share's activations and the gradient chunk of its output.
* ``balanced`` (:class:`~encoding.parallel.DataParallelModel` + :class:`~encoding.parallel.DataParallelCriterion`):
  the same without the whole-batch tensors: each device computes the loss of its own share.
* ``balanced-auto``: ``balanced`` with the split that minimises the heaviest device
  (:func:`encoding.parallel.balance.plan_split`).
* ``ddp`` (``DistributedDataParallel``): every rank holds parameters, gradients, optimizer state, DDP's gradient
  buckets (one more copy of the gradients) and its share's activations.

Each distinct *device program* (:class:`DeviceProgram`: strategy, role, share) is a real, single-device program
written with our real model, criterion and optimizer. :func:`simulate_program` runs it on fake tensors
(``FakeTensorMode``) under :class:`AllocationTracker`, which counts the bytes of every storage an operator creates
until it is freed; :func:`measure_program_cpu` runs the same program on real CPU tensors under
``torch.profiler`` (the ``"Total Allocated"`` of its memory events), which is how the simulator is checked
(``benchmarks/bench_memory.py``, ``tests/test_memory.py``). Kernels' internal workspaces never appear as tensors;
:func:`learn_workspaces` learns them per operator from a few real steps (``--calibrate``).
"""
from __future__ import annotations

import bisect
import contextlib
import functools
import json
import os
import tempfile
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .reduction import criterion_loss_terms, reduce_loss_terms
from .structures import iter_leaves, transpose_map

__all__ = ["STRATEGIES", "MIB", "AllocationTracker", "Workspaces", "StepSpec", "DeviceProgram", "ProgramResult",
           "device_programs", "run_program", "simulate_program", "measure_program_cpu", "learn_workspaces",
           "Simulator", "new_fake_mode", "tensor_leaves", "default_optimizer", "step_autocast"]

MIB = 2 ** 20
#: The strategies the memory tool compares, in report order.
STRATEGIES: Tuple[str, ...] = ("gather", "balanced", "balanced-auto", "ddp")
#: DDP's default bucket capacity (``bucket_cap_mb=25``) and first-bucket size.
_DDP_BUCKET_BYTES = 25 * MIB
_DDP_FIRST_BUCKET_BYTES = 1 * MIB
#: The profiler range that marks the measured step.
_MARK = "encoding.memory.step"


# ------------------------------------------------------------------------------------------------ allocation tracking
class AllocationTracker(TorchDispatchMode):
    """Count the bytes of live tensor storages created by operators, and their peak.

    Every operator output whose storage was not seen before adds its ``nbytes`` (rounded up to ``round_to``, e.g.
    512 like the CUDA caching allocator's blocks); a weak reference subtracts it when the storage is freed. Views and
    in-place results share a seen storage and add nothing. On fake tensors a host read (``.item()``, ``.tolist()``)
    has no value: it returns ``0``, so code that checks values (e.g. a target range check) passes.

    Args:
        round_to: allocation granularity in bytes.
        workspaces: per-operator workspaces learned from a real run (:class:`Workspaces`); while such an operator
            runs, ``live`` is raised by what it held beyond its inputs.
        shares: the batch sizes the simulated program's operators see (its share, and the whole batch where it
            computes a gathered loss), to look ``workspaces`` up.

    Attributes:
        live: bytes currently allocated.
        peak: the largest ``live`` since the last :meth:`reset_peak`.
    """

    def __init__(self, round_to: int = 1, workspaces: Optional["Workspaces"] = None,
                 shares: Sequence[int] = (1,)) -> None:
        super().__init__()
        self.round_to = max(1, int(round_to))
        self.workspaces = workspaces
        self.shares = tuple(shares)
        self.live = 0
        self.peak = 0
        self._sizes: Dict[int, int] = {}
        self._refs: Dict[int, weakref.ref] = {}

    def track(self, tensors: Any) -> None:
        """Count tensors created outside the tracker (e.g. a module's fake parameters)."""
        for _, leaf in iter_leaves(tensors):
            if isinstance(leaf, Tensor):
                self._add(leaf)

    def reset_peak(self) -> None:
        """Start a new peak window at the current live bytes."""
        self.peak = self.live

    def _rounded(self, nbytes: int) -> int:
        return -(-nbytes // self.round_to) * self.round_to

    def _add(self, tensor: Tensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        size = self._rounded(storage.nbytes())
        known = self._sizes.get(key)
        if known is not None and self._refs[key]() is storage:
            if known != size:  # resized in place
                self.live += size - known
                self._sizes[key] = size
        else:
            self._sizes[key] = size
            self._refs[key] = weakref.ref(storage, functools.partial(self._free, key))
            self.live += size
        self.peak = max(self.peak, self.live)

    def _free(self, key: int, ref: weakref.ref) -> None:
        if self._refs.get(key) is ref:
            self.live -= self._sizes.pop(key)
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            return 0
        if self.workspaces is not None:
            held = self.workspaces.bytes(func.name(), _shapes(args, kwargs), *self.shares)
            self.peak = max(self.peak, self.live + held)
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, Tensor):
                self._add(leaf)
        return out


def _shapes(args: Any, kwargs: Any) -> List[Tuple[int, ...]]:
    return [tuple(t.shape) for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor) and t.dim()]


def _batch_key(name: str, shapes: Sequence[Sequence[int]], share: int) -> tuple:
    """An operator call with the batch dimension (a leading ``share`` of a tensor of 2+ dims) made symbolic."""
    return (name.split("::")[-1].split(".")[0],
            tuple(("B",) + tuple(s[1:]) if len(s) >= 2 and s[0] == share else tuple(s) for s in shapes))


class Workspaces:
    """Bytes that operators hold beyond the tensors they return (kernels' internal buffers), learned from the
    ``torch.profiler`` memory events of real steps at a few batch shares.

    For every operator call of a profiled real step (:func:`learn_workspaces`), the bytes it held above its
    starting level (its outputs included) are recorded under ``(operator, input shapes with the batch dimension
    symbolic)`` and the share. The tracker raises its peak by that much while the same call runs on fake tensors.
    Between measured shares the bytes are interpolated linearly, beyond them the last segment is extrapolated
    (CPU kernels keep one buffer per thread, so growth flattens once the share reaches the thread count: measure
    at 1, the thread count and one more).
    """

    def __init__(self, table: Dict[tuple, Dict[int, int]]) -> None:
        self.table = table

    def bytes(self, name: str, shapes: Sequence[Sequence[int]], *shares: int) -> int:
        """Workspace (outputs included) of operator ``name`` on inputs ``shapes`` (0 if unknown); the batch
        dimension is the first of ``shares`` that makes a known call."""
        for share in shares:
            known = self.table.get(_batch_key(name, shapes, share))
            if known:
                return self._at(known, share)
        return 0

    @staticmethod
    def _at(known: Dict[int, int], share: int) -> int:
        points = sorted(known.items())
        if len(points) == 1 or share <= points[0][0]:
            return points[0][1]
        i = min(max(bisect.bisect_left([p for p, _ in points], share), 1), len(points) - 1)
        (s1, b1), (s2, b2) = points[i - 1], points[i]
        return max(0, int(round(b1 + (b2 - b1) * (share - s1) / (s2 - s1))))

    def __len__(self) -> int:
        return len(self.table)


def _memory_levels(events: List[dict], device: torch.device) -> List[Tuple[float, int]]:
    """``(timestamp, Total Allocated)`` of the profiler's memory events on ``device``, in time order."""
    kind = 1 if device.type == "cuda" else 0
    return sorted((e["ts"], e["args"]["Total Allocated"]) for e in events
                  if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == kind
                  and (kind == 0 or e["args"].get("Device Id") == device.index))


def _op_workspaces(events: List[dict], share: int, span: Tuple[float, float], device: torch.device
                   ) -> Dict[tuple, int]:
    """Per operator call inside ``span`` of a chrome trace: the largest ``Total Allocated`` inside the call minus
    the level at its start (only calls that held more than they returned are kept)."""
    memory = _memory_levels(events, device)
    stamps = [ts for ts, _ in memory]
    found: Dict[tuple, int] = {}
    for e in events:
        if e.get("ph") != "X" or not str(e.get("name", "")).startswith("aten::"):
            continue
        if not span[0] <= e["ts"] <= span[1]:
            continue
        dims = (e.get("args") or {}).get("Input Dims")
        if dims is None:
            continue
        first = bisect.bisect_left(stamps, e["ts"])
        last = bisect.bisect_right(stamps, e["ts"] + e["dur"])
        if first >= last:
            continue
        start = memory[first - 1][1] if first else 0
        held = max(total for _, total in memory[first:last]) - start
        end = memory[last - 1][1] - start
        if held > max(end, 0):
            shapes = [d for d in dims if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
            key = _batch_key(e["name"], shapes, share)
            found[key] = max(found.get(key, 0), held)
    return found


# ------------------------------------------------------------------------------------------------ what a step is
def default_optimizer(params: List[Tensor]) -> torch.optim.Optimizer:
    """SGD with momentum 0.9 and weight decay, as the segmentation recipes use (device 0 holds its momentum), in
    its multi-tensor (``foreach``) form, torch's default on GPUs: its weight decay makes a transient copy of the
    gradients."""
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4, foreach=True)


@dataclass(frozen=True)
class StepSpec:
    """One training step, independent of any device.

    Attributes:
        build_model: builds the module on the current default device (called inside the simulator's fake mode, or
            for real); it is put in training mode.
        make_inputs: ``share -> (args, kwargs)``: the model's inputs for ``share`` samples.
        make_target: ``share -> target`` for ``share`` samples.
        criterion: ``criterion(output, target)``; evaluated through the exact-reduction protocol
            (:func:`~encoding.parallel.reduction.criterion_loss_terms`), as :class:`~encoding.parallel.DataParallelCriterion`
            does on each device.
        optimizer: ``params -> optimizer`` (default: SGD with momentum 0.9 and weight decay).
        amp_dtype: autocast dtype for forward and loss (``None``: full precision).
    """

    build_model: Callable[[], nn.Module]
    make_inputs: Callable[[int], Tuple[tuple, dict]]
    make_target: Callable[[int], Any]
    criterion: Callable[..., Any]
    optimizer: Callable[[List[Tensor]], torch.optim.Optimizer] = default_optimizer
    amp_dtype: Optional[torch.dtype] = None


@dataclass(frozen=True)
class DeviceProgram:
    """What one device runs in one step; equal programs have equal peaks, so each is simulated once.

    Attributes:
        strategy: ``"gather"``, ``"balanced"`` or ``"ddp"`` (``balanced-auto`` runs ``balanced`` programs).
        share: samples this device processes.
        total: samples in the whole batch (the gathered outputs of ``gather`` hold ``total``).
        source: device 0 of ``gather``/``balanced``: it holds the module, the optimizer state and the reduced
            gradients.
        replicas: devices that run a replica in this step (the gradients are reduced when more than one).
    """

    strategy: str
    share: int
    total: int
    source: bool
    replicas: int

    @property
    def keeps_module(self) -> bool:
        """Holds the trained module's gradients and optimizer state (device 0, or any DDP rank)."""
        return self.source or self.strategy == "ddp"

    @property
    def receives_gradients(self) -> bool:
        """Device 0 receives the sum of the other replicas' gradients."""
        return self.source and self.replicas > (1 if self.share else 0)

    def canonical(self) -> "DeviceProgram":
        """The same program with the fields that do not change what it holds normalised (a cache key)."""
        total = self.total if self.strategy == "gather" and self.source else self.share
        return DeviceProgram(self.strategy, self.share, total, self.source, 2 if self.receives_gradients else 1)


def device_programs(strategy: str, split: Sequence[int]) -> List[DeviceProgram]:
    """One :class:`DeviceProgram` per device for ``strategy`` with samples per device ``split``.

    Args:
        strategy: one of :data:`STRATEGIES` (``balanced-auto`` is ``balanced`` with its own split).
        split: samples per device, one entry per device (zeros allowed except for ``ddp``).
    """
    total = sum(split)
    replicas = sum(1 for n in split if n > 0)
    kind = "balanced" if strategy == "balanced-auto" else strategy
    if kind not in ("gather", "balanced", "ddp"):
        raise ValueError(f"unknown strategy {strategy!r}; valid strategies: {', '.join(STRATEGIES)}")
    return [DeviceProgram(kind, n, total, source=(i == 0 and kind != "ddp"), replicas=replicas)
            for i, n in enumerate(split)]


# ------------------------------------------------------------------------------------------------ the device program
class _GatherInto(torch.autograd.Function):
    """This device's output copied into a new whole-batch tensor (the other devices' rows arrive there);
    backward hands this device the view of its rows (torch's Scatter on the same device)."""

    @staticmethod
    def forward(ctx, output: Tensor, total: int) -> Tensor:
        ctx.rows = output.shape[0]
        whole = output.new_zeros((total,) + tuple(output.shape[1:]))
        whole[:ctx.rows].copy_(output)
        return whole

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad[:ctx.rows], None


class _Ship(torch.autograd.Function):
    """This device's output leaves for device 0 (and is freed); backward receives the gradient chunk as a copy."""

    @staticmethod
    def forward(ctx, output: Tensor) -> Tensor:
        ctx.shape, ctx.dtype, ctx.device = output.shape, output.dtype, output.device
        return output.new_zeros(())

    @staticmethod
    def backward(ctx, grad: Tensor):
        return torch.zeros(ctx.shape, dtype=ctx.dtype, device=ctx.device)


def tensor_leaves(tree: Any) -> List[Tensor]:
    """The tensors of a nested output that require grad."""
    return [leaf for _, leaf in iter_leaves(tree) if isinstance(leaf, Tensor) and leaf.requires_grad]


def _gather_whole(outputs: Any, total: int) -> Any:
    def leaf(value: Any) -> List[Any]:
        if isinstance(value, Tensor) and value.dim() > 0:
            return [_GatherInto.apply(value, total)]
        return [value]
    return transpose_map(leaf, outputs, 1)[0]


def _ddp_buckets(params: List[Tensor]) -> List[Tensor]:
    """DDP's gradient buckets: flat tensors filled in reverse parameter order, 1 MiB first, then 25 MiB each."""
    sizes, numel, cap = [], 0, _DDP_FIRST_BUCKET_BYTES
    for p in reversed(params):
        numel += p.numel()
        if numel * p.element_size() >= cap:
            sizes.append(numel)
            numel, cap = 0, _DDP_BUCKET_BYTES
    if numel:
        sizes.append(numel)
    return [params[0].new_empty(n) for n in sizes]


@contextlib.contextmanager
def _world_of_one() -> Iterator[None]:
    """A one-process gloo group while a real ``DistributedDataParallel`` runs in this process (destroyed after,
    when it was made here, so the process does not look distributed to later code)."""
    import torch.distributed as dist

    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if made:
            dist.destroy_process_group()


def step_autocast(spec: StepSpec, device_type: str):
    """Autocast for ``spec``'s forward and loss on ``device_type`` (a no-op without ``amp_dtype``)."""
    if spec.amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=spec.amp_dtype)


def _loss(spec: StepSpec, output: Any, target: Any, share: int) -> Tensor:
    terms = criterion_loss_terms(spec.criterion, (output, target), {}, share)
    return reduce_loss_terms([terms]) if isinstance(terms, list) else terms.sum()


def _step(spec: StepSpec, program: DeviceProgram, model: nn.Module, params: List[Tensor],
          optimizer: Optional[torch.optim.Optimizer], device_type: str) -> None:
    if program.share:
        _forward_backward(spec, program, model, device_type)
    if program.receives_gradients:
        # the sums of every replica's gradients arrive beside replica 0's own (or alone, when device 0 sat out)
        reduced = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
        for p, g in zip(params, reduced):
            p.grad = g
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    else:  # a replica's gradients leave for device 0
        for p in params:
            p.grad = None


def _forward_backward(spec: StepSpec, program: DeviceProgram, model: nn.Module, device_type: str) -> None:
    args, kwargs = spec.make_inputs(program.share)
    with step_autocast(spec, device_type):
        outputs = model(*args, **kwargs)
        del args, kwargs
        if program.strategy == "gather" and not program.source:
            handles = [_Ship.apply(t) for t in tensor_leaves(outputs)]
            del outputs
            loss = sum(handles)
        elif program.strategy == "gather":
            outputs = _gather_whole(outputs, program.total)
            loss = _loss(spec, outputs, spec.make_target(program.total), program.total)
        else:
            loss = _loss(spec, outputs, spec.make_target(program.share), program.share)
        outputs = None
    loss.backward()


@contextlib.contextmanager
def _any_batchnorm_batch() -> Iterator[None]:
    """Let BatchNorm train on one value per channel (a device with one sample behind global pooling): in
    multi-device training ``SyncBatchNorm``'s statistics span the replicas, which a single-device program cannot
    show. Such calls skip the running-statistics update (C values updated in place; the memory is the same)."""
    check, batch_norm = F._verify_batch_size, F.batch_norm

    def one_sample_batch_norm(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
                              *args: Any, **kwargs: Any) -> Tensor:
        training = kwargs.get("training", args[2] if len(args) > 2 else False)
        if training and input.dim() > 1 and input.numel() == input.shape[1]:
            running_mean = running_var = None
        return batch_norm(input, running_mean, running_var, *args, **kwargs)

    F._verify_batch_size, F.batch_norm = (lambda size: None), one_sample_batch_norm
    try:
        yield
    finally:
        F._verify_batch_size, F.batch_norm = check, batch_norm


def _optimizer_warmup(params: List[Tensor], optimizer: Optional[torch.optim.Optimizer]) -> None:
    """What a warm-up step leaves behind on fake tensors: the optimizer's state (e.g. momentum buffers)."""
    if optimizer is not None:
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def run_program(spec: StepSpec, program: DeviceProgram, device_type: str = "cpu",
                window: Callable[[], Any] = contextlib.nullcontext, steps: int = 1,
                track: Callable[[List[Tensor]], None] = lambda tensors: None, real_ddp: bool = False,
                model: Optional[nn.Module] = None) -> float:
    """Run ``program``: build, one warm-up step, then ``steps`` steps each inside ``window()``.

    Args:
        spec: the step.
        program: what this device does.
        device_type: for autocast (tensors are created where ``spec`` creates them).
        window: context manager marking a measured step (a peak window, a profiler range).
        steps: measured steps.
        track: called with the model's parameters and buffers once it is built (for tensors made without an
            operator, e.g. converted to fake tensors).
        real_ddp: run a ``ddp`` program through a real ``DistributedDataParallel`` (a one-process gloo group)
            instead of modelling its gradient buckets.
        model: a model built by ``spec.build_model`` on fake tensors, reused across programs: its parameters have
            no values, so the warm-up step is reduced to what it leaves behind (the optimizer state).

    Returns:
        Seconds of the last measured step.
    """
    ddp_group = _world_of_one() if real_ddp and program.strategy == "ddp" else contextlib.nullcontext()
    with _any_batchnorm_batch(), ddp_group:
        return _run_program(spec, program, device_type, window, steps, track, real_ddp, model)


def _run_program(spec: StepSpec, program: DeviceProgram, device_type: str, window: Callable[[], Any], steps: int,
                 track: Callable[[List[Tensor]], None], real_ddp: bool, model: Optional[nn.Module]) -> float:
    reuse = model is not None
    model = model if reuse else spec.build_model()
    model.train()
    track(list(model.parameters()) + list(model.buffers()))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = spec.optimizer(params) if program.keeps_module else None
    buckets = []
    if program.strategy == "ddp" and real_ddp:
        model = nn.parallel.DistributedDataParallel(model)
    elif program.strategy == "ddp" and params:
        buckets = _ddp_buckets(params)  # held for the whole run, like DDP's
    if reuse:
        _optimizer_warmup(params, optimizer)
    else:
        _step(spec, program, model, params, optimizer, device_type)
    seconds = 0.0
    for _ in range(steps):
        with window():
            start = time.perf_counter()
            _step(spec, program, model, params, optimizer, device_type)
            seconds = time.perf_counter() - start
    del buckets
    return seconds


# ------------------------------------------------------------------------------------------------ simulate and measure
@dataclass
class ProgramResult:
    """The peak of one device program. ``peak`` in bytes, ``seconds`` of the measured step."""

    peak: int
    seconds: float


def new_fake_mode() -> Any:
    """A ``FakeTensorMode`` that accepts real tensors as constants."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def simulate_program(spec: StepSpec, program: DeviceProgram, round_to: int = 1, fake_mode: Any = None,
                     workspaces: Optional[Workspaces] = None, model: Optional[nn.Module] = None) -> ProgramResult:
    """Peak bytes of ``program`` on fake CPU tensors (no memory is allocated, no kernel runs).

    Args:
        spec: the step; its callables run inside ``FakeTensorMode``.
        program: the device program.
        round_to: allocation granularity (512 for a CUDA caching allocator).
        fake_mode: the ``FakeTensorMode`` to run in (one that ``spec``'s tensors already belong to), default new.
        workspaces: kernels' workspaces learned by :func:`learn_workspaces` (default: none).
        model: a model already built by ``spec.build_model`` in ``fake_mode`` (see :func:`run_program`).
    """
    tracker = AllocationTracker(round_to, workspaces, (program.share, program.total))
    with (fake_mode or new_fake_mode()), tracker:
        @contextlib.contextmanager
        def window() -> Iterator[None]:
            tracker.reset_peak()
            yield
        seconds = run_program(spec, program, "cpu", window, track=tracker.track, model=model)
    return ProgramResult(tracker.peak, seconds)


def _step_span(events: List[dict]) -> Tuple[float, float]:
    spans = [e for e in events if e.get("name") == _MARK and e.get("ph") == "X"]
    if not spans:
        raise RuntimeError(f"the profiler trace has no {_MARK!r} range")
    return spans[-1]["ts"], spans[-1]["ts"] + spans[-1]["dur"]


def _profiled_peak(events: List[dict], device: torch.device) -> int:
    start, end = _step_span(events)
    memory = _memory_levels(events, device)
    before = [total for ts, total in memory if ts < start]
    inside = [total for ts, total in memory if start <= ts <= end]
    return max(before[-1:] + inside)


def _profile_program(spec: StepSpec, program: DeviceProgram, device: torch.device, record_shapes: bool = False
                     ) -> Tuple[List[dict], float]:
    """Run ``program`` for real on ``device`` under ``torch.profiler``; return the trace events and the step
    time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, profile_memory=True, record_shapes=record_shapes) as prof:
        with torch.device(device):
            seconds = run_program(spec, program, device.type,
                                  functools.partial(torch.profiler.record_function, _MARK), real_ddp=True)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            return json.load(f)["traceEvents"], seconds
    finally:
        os.unlink(path)


def measure_program_cpu(spec: StepSpec, program: DeviceProgram) -> ProgramResult:
    """Peak bytes of ``program`` run for real on the CPU, from ``torch.profiler`` memory events.

    The profiler starts before the model is built, so ``"Total Allocated"`` is the live bytes of the program; the
    peak is the largest value inside the measured step (and the value when it starts).
    """
    cpu = torch.device("cpu")
    events, seconds = _profile_program(spec, program, cpu)
    return ProgramResult(_profiled_peak(events, cpu), seconds)


def learn_workspaces(spec: StepSpec, shares: Optional[Sequence[int]] = None,
                     device: torch.device = torch.device("cpu")) -> Workspaces:
    """Learn kernels' workspaces from real steps (one per share) of a device that runs a replica.

    Args:
        spec: the step (its callables create tensors on the current default device, which is set to ``device``).
        shares: the batch shares to run (default: 1, and on the CPU the intra-op thread count ``T`` and ``T + 1``,
            on a GPU 2).
        device: where to run them (the CPU, or a CUDA device: the profiler's CUDA memory events are used).
    """
    if shares is None:
        threads = torch.get_num_threads() if device.type == "cpu" else 1
        shares = sorted({1, threads, threads + 1})
    table: Dict[tuple, Dict[int, int]] = {}
    for share in shares:
        program = DeviceProgram("balanced", share, share * 2, source=False, replicas=2)
        events, _ = _profile_program(spec, program, device, record_shapes=True)
        for key, held in _op_workspaces(events, share, _step_span(events), device).items():
            table.setdefault(key, {})[share] = held
    return Workspaces(table)


class Simulator:
    """Simulated peaks of the device programs of one :class:`StepSpec`, each distinct program run once.

    Args:
        spec: the step.
        round_to: allocation granularity (512 for CUDA).
        fake_mode: as for :func:`simulate_program`.
        workspaces: kernels' workspaces (see :func:`learn_workspaces`); default none.
    """

    def __init__(self, spec: StepSpec, round_to: int = 1, fake_mode: Any = None,
                 workspaces: Optional[Workspaces] = None) -> None:
        self.spec = spec
        self.round_to = round_to
        self.fake_mode = fake_mode if fake_mode is not None else new_fake_mode()
        self.workspaces = workspaces
        self._model: Optional[nn.Module] = None
        self._cache: Dict[DeviceProgram, ProgramResult] = {}

    @property
    def programs_run(self) -> int:
        """How many distinct programs were simulated."""
        return len(self._cache)

    def result(self, program: DeviceProgram) -> ProgramResult:
        """The (cached) simulation of ``program``; devices with nothing to hold peak at 0."""
        if not program.share and not program.keeps_module:
            return ProgramResult(0, 0.0)
        key = program.canonical()
        if key not in self._cache:
            if self._model is None:
                with self.fake_mode:
                    self._model = self.spec.build_model()
            self._cache[key] = simulate_program(self.spec, key, self.round_to, self.fake_mode, self.workspaces,
                                                self._model)
        return self._cache[key]

    def peak(self, program: DeviceProgram) -> int:
        """Simulated peak bytes of ``program``."""
        return self.result(program).peak

    def peaks(self, strategy: str, split: Sequence[int]) -> List[int]:
        """Peak bytes per device for ``strategy`` with samples per device ``split``."""
        return [self.peak(p) for p in device_programs(strategy, split)]
