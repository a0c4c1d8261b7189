"""What one device does in one training step: the step (:class:`StepSpec`), the device program of each strategy
(:class:`DeviceProgram`, :func:`device_programs`) and the code that runs it (:func:`run_program`).

What one device holds during a steady-state training step (forward, loss, backward, SGD-momentum step, after one
warm-up step) depends on the strategy:

* ``gather`` (``torch.nn.DataParallel``): device 0 holds the module's parameters, buffers and optimizer state,
  replica 0 (aliasing the parameters), its share's activations, the **gathered whole-batch outputs**, the
  whole-batch loss and its gradients, and at the end of backward replica 0's gradients beside the reduced sums.
  Every other device holds a broadcast replica, its share's activations and the gradient chunk of its output.
* ``balanced`` (:class:`~encoding.parallel.DataParallelModel` + :class:`~encoding.parallel.DataParallelCriterion`):
  the same without the whole-batch tensors: each device computes the loss of its own share.
* ``balanced-auto``: ``balanced`` with the split that minimises the heaviest device
  (:func:`encoding.memory.balance.plan_split`).
* ``ddp`` (``DistributedDataParallel``): every rank holds parameters, gradients, optimizer state, DDP's gradient
  buckets (one more copy of the gradients) and its share's activations.

Each distinct device program is a real, single-device program written with our real model, criterion and optimizer:
:mod:`encoding.memory.simulate` runs it on fake tensors, :mod:`encoding.memory.profiler` on real CPU tensors under
``torch.profiler`` (how the simulator is checked: ``benchmarks/bench_memory.py``, ``tests/test_memory.py``).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config.tools import BACKENDS as _BACKENDS, DEFAULT_STRATEGIES as _DEFAULT_STRATEGIES, MEMORY_STRATEGIES
from ..parallel.reduction import LossTree, criterion_loss_terms, reduce_loss_terms, reduce_loss_trees
from ..parallel.structures import iter_leaves, transpose_map
from .optimizers import build_optimizer, optimizer_factory, optimizer_key, optimizer_state, optimizer_warmup
from .sharded import is_sharded, rank_world, shard_model, sharded_gradients
from .tracker import MIB

__all__ = ["MEMORY_STRATEGIES", "BACKENDS", "StepSpec", "DeviceProgram", "ProgramResult", "device_programs",
           "run_program", "default_optimizer", "step_autocast", "tensor_leaves"]

#: What ``--strategies`` simulates when not given (``fsdp`` and ``zero1`` on request).
DEFAULT_STRATEGIES: Tuple[str, ...] = _DEFAULT_STRATEGIES
#: The strategies whose ranks are processes of a ``torch.distributed`` group (every rank keeps the module).
DISTRIBUTED: Tuple[str, ...] = ("ddp", "fsdp", "zero1")
#: The collective libraries a simulated rank can stand for (see :func:`run_program`).
BACKENDS: Tuple[str, ...] = _BACKENDS
#: DDP's default bucket capacity (``bucket_cap_mb=25``) and first-bucket size.
_DDP_BUCKET_BYTES = 25 * MIB
_DDP_FIRST_BUCKET_BYTES = 1 * MIB


def default_optimizer(params: List[Tensor]) -> torch.optim.Optimizer:
    """SGD with momentum 0.9 and weight decay, as the segmentation recipes use (device 0 holds its momentum), in
    its multi-tensor (``foreach``) form, torch's default on GPUs: its weight decay makes a transient copy of the
    gradients."""
    return optimizer_factory()(params)


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
        keep_outputs: the loop holds the model's outputs through backward (``outputs = model(x); loss =
            criterion(outputs, y); loss.backward()``); default ``False``: ``criterion(model(x), y).backward()``, the
            loop of ``train.py``, which frees them before backward.
    """

    build_model: Callable[[], nn.Module]
    make_inputs: Callable[[int], Tuple[tuple, dict]]
    make_target: Callable[[int], Any]
    criterion: Callable[..., Any]
    optimizer: Callable[[List[Tensor]], torch.optim.Optimizer] = default_optimizer
    amp_dtype: Optional[torch.dtype] = None
    keep_outputs: bool = False


@dataclass(frozen=True)
class DeviceProgram:
    """What one device runs in one step; equal programs have equal peaks, so each is simulated once.

    Attributes:
        strategy: ``"gather"``, ``"balanced"``, ``"ddp"``, ``"fsdp"`` or ``"zero1"`` (``balanced-auto`` runs
            ``balanced`` programs).
        share: samples this device processes.
        total: samples in the whole batch (the gathered outputs of ``gather`` hold ``total``).
        source: device 0 of ``gather``/``balanced``: it holds the module, the optimizer state and the reduced
            gradients.
        replicas: devices that run a replica in this step (the gradients are reduced when more than one); the world
            size of ``fsdp`` and ``zero1``.
        rank: this process's rank (``fsdp``, ``zero1``: which shard of the parameters or optimizer state it holds).
    """

    strategy: str
    share: int
    total: int
    source: bool
    replicas: int
    rank: int = 0

    @property
    def keeps_module(self) -> bool:
        """Holds the trained module's gradients and optimizer state (device 0, or any rank of a process group)."""
        return self.source or self.strategy in DISTRIBUTED

    @property
    def receives_gradients(self) -> bool:
        """Device 0 receives the sum of the other replicas' gradients."""
        return self.source and self.replicas > (1 if self.share else 0)

    def canonical(self) -> "DeviceProgram":
        """The same program with the fields that do not change what it holds normalised (a cache key)."""
        total = self.total if self.strategy == "gather" and self.source else self.share
        if self.strategy in ("fsdp", "zero1"):  # the rank's shards (fsdp) or partition (zero1) may differ
            return DeviceProgram(self.strategy, self.share, total, False, self.replicas, self.rank)
        return DeviceProgram(self.strategy, self.share, total, self.source, 2 if self.receives_gradients else 1)


def device_programs(strategy: str, split: Sequence[int]) -> List[DeviceProgram]:
    """One :class:`DeviceProgram` per device for ``strategy`` with samples per device ``split``.

    Args:
        strategy: one of :data:`MEMORY_STRATEGIES` (``balanced-auto`` is ``balanced`` with its own split).
        split: samples per device, one entry per device (zeros allowed except for ``ddp``).
    """
    total = sum(split)
    replicas = sum(1 for n in split if n > 0)
    kind = "balanced" if strategy == "balanced-auto" else strategy
    if kind not in MEMORY_STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; valid strategies: {', '.join(MEMORY_STRATEGIES)}")
    if kind in ("fsdp", "zero1"):
        return [DeviceProgram(kind, n, total, False, len(split), rank) for rank, n in enumerate(split)]
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


def step_autocast(spec: StepSpec, device_type: str):
    """Autocast for ``spec``'s forward and loss on ``device_type`` (a no-op without ``amp_dtype``)."""
    if spec.amp_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=spec.amp_dtype)


def _loss(spec: StepSpec, output: Any, target: Any, share: int) -> Tensor:
    """The loss backpropagated: the criterion's, or the sum of the scalar losses of a container it returns."""
    terms = criterion_loss_terms(spec.criterion, (output, target), {}, share)
    if isinstance(terms, LossTree):
        losses = [v for _, v in iter_leaves(reduce_loss_trees([terms])) if isinstance(v, Tensor)]
        if not losses:
            raise ValueError(f"criterion {spec.criterion!r} returned a container without a loss: nothing to plan")
        return torch.stack(losses).sum()
    return reduce_loss_terms([terms]) if isinstance(terms, list) else terms.sum()


def _step(spec: StepSpec, program: DeviceProgram, model: nn.Module, params: List[Tensor],
          optimizer: Optional[torch.optim.Optimizer], device_type: str,
          mark: Callable[[], None] = lambda: None, gradients_only: bool = False,
          forward_backward_only: bool = False) -> None:
    if program.share and gradients_only and is_sharded(model):  # what forward and backward leave
        sharded_gradients(model)
    elif program.share and gradients_only:  # a gradient for every parameter
        for p in params:
            p.grad = torch.zeros_like(p)
    elif program.share:
        _forward_backward(spec, program, model, device_type)
    mark()  # forward and backward done: the rest (gradients arriving, optimizer step) does not depend on the input
    if not forward_backward_only:  # else the rest is another program's
        if program.receives_gradients:
            # the sums of every replica's gradients arrive beside replica 0's own (or alone, when device 0 sat out)
            reduced = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
            for p, g in zip(params, reduced):
                p.grad = g
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return
    for p in params:  # a replica's gradients leave for device 0; without the rest, dropped as zero_grad drops them
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
        if not spec.keep_outputs:  # train.py's loop: the outputs are gone before backward
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


def run_program(spec: StepSpec, program: DeviceProgram, device_type: str = "cpu",
                window: Callable[[], Any] = contextlib.nullcontext, steps: int = 1,
                track: Callable[[List[Tensor]], None] = lambda tensors: None, real_ddp: bool = False,
                model: Optional[nn.Module] = None, backend: str = "nccl",
                mark: Callable[[], None] = lambda: None,
                optimizers: Optional[Dict[tuple, Any]] = None, gradients_only: bool = False,
                forward_backward_only: bool = False) -> float:
    """Run ``program``: build, one warm-up step, then ``steps`` steps each inside ``window()``.

    Args:
        spec: the step.
        program: what this device does.
        device_type: for autocast (tensors are created where ``spec`` creates them).
        window: context manager marking a measured step (a peak window, a profiler range).
        steps: measured steps.
        track: called with the model's parameters and buffers once it is built (for tensors made without an
            operator, e.g. converted to fake tensors).
        real_ddp: run a ``ddp`` or ``zero1`` program through a real ``DistributedDataParallel`` (in the process
            group of this process, else a one-process gloo group) instead of modelling its gradient buckets, and
            ``fsdp``'s optimizer on the ``DTensor`` parameters instead of their local shards.
        model: a model built by ``spec.build_model`` on fake tensors, reused across programs: its parameters have
            no values, so the warm-up step is reduced to what it leaves behind (the optimizer state). ``fsdp``
            reuses a model sharded before (:func:`~encoding.memory.sharded.is_sharded`), else builds and shards its
            own and runs a full warm-up step.
        backend: the collective library a simulated ``fsdp`` rank stands for (its fake process group runs no
            collective): ``"nccl"`` works in place; ``"gloo"`` stages each all-gather output and reduce-scatter
            input in a buffer of its own while the collective runs (:func:`~encoding.memory.sharded.shard_model`).
            A real group (``real_ddp``) allocates what it does.
        mark: called in each measured step when its forward and backward are done (before the gradients of other
            replicas arrive and the optimizer steps).
        optimizers: with ``model``: the optimizers of the programs run on it before, warmed up, by
            :func:`~encoding.memory.optimizers.optimizer_key` (filled on first use): a program whose key is there
            steps that optimizer, its state counted by ``track``, instead of building one and running its warm-up
            step (the same state: the warm-up's zero gradients leave the same buffers every time).
        gradients_only: the measured steps' forward and backward replaced by what they leave, a gradient for every
            parameter (``fsdp``: FSDP2's reduce-scatter outputs, :func:`~encoding.memory.sharded.sharded_gradients`):
            the rest of the step alone, for a program whose forward and backward another program ran
            (:class:`~encoding.memory.simulate.Simulator`'s ``zero1`` and ``fsdp`` ranks).
        forward_backward_only: the measured steps end when their forward and backward are done (at ``mark``),
            their gradients dropped: the step without its rest, for a program whose rest another program ran
            (the advice's further checkpointing policies, :mod:`~encoding.memory.advice`).

    ``fsdp`` and ``zero1`` run in the process group of this process (its world size and rank must be the
    program's), else in a fake one of the program's size (:func:`~encoding.memory.sharded.rank_world`).

    Returns:
        Seconds of the last measured step.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; valid: {', '.join(BACKENDS)}")
    if gradients_only and forward_backward_only:
        raise ValueError("gradients_only (the rest alone) and forward_backward_only (no rest) exclude each other")
    if program.strategy in ("fsdp", "zero1"):
        group = rank_world(program.replicas, program.rank)
    elif real_ddp and program.strategy == "ddp":
        group = rank_world(None, 0, "gloo")
    else:
        group = contextlib.nullcontext()
    with _any_batchnorm_batch(), group:
        return _run_program(spec, program, device_type, window, steps, track, real_ddp, model, backend, mark,
                            optimizers, gradients_only, forward_backward_only)


def _run_program(spec: StepSpec, program: DeviceProgram, device_type: str, window: Callable[[], Any], steps: int,
                 track: Callable[[List[Tensor]], None], real_ddp: bool, model: Optional[nn.Module],
                 backend: str, mark: Callable[[], None], optimizers: Optional[Dict[tuple, Any]] = None,
                 gradients_only: bool = False, forward_backward_only: bool = False) -> float:
    # sharding changes the module: fsdp shards its own, or reuses one sharded before (is_sharded)
    reuse = model is not None and (program.strategy != "fsdp" or is_sharded(model))
    model = model if reuse else spec.build_model()
    model.train()
    track(list(model.parameters()) + list(model.buffers()))
    if program.strategy == "fsdp" and not reuse:
        model = shard_model(model, staged_collectives=backend == "gloo" and not real_ddp)
    params = [p for p in model.parameters() if p.requires_grad]
    key = optimizer_key(program) if reuse and optimizers is not None else None
    warm = key is not None and key in optimizers
    optimizer = optimizers[key] if warm else build_optimizer(spec, program, params, real_ddp)
    if warm:
        track(optimizer_state(optimizer))
    elif key is not None and optimizer is not None:
        optimizers[key] = optimizer
    buckets = []
    if program.strategy in ("ddp", "zero1") and real_ddp:
        model = nn.parallel.DistributedDataParallel(model)
    elif program.strategy in ("ddp", "zero1") and params:
        buckets = _ddp_buckets(params)  # held for the whole run, like DDP's
    if reuse and not warm:  # a warmed optimizer's state is there (counted above)
        optimizer_warmup(params, optimizer)
    elif not reuse:
        _step(spec, program, model, params, optimizer, device_type)
    seconds = 0.0
    for _ in range(steps):
        with window():
            start = time.perf_counter()
            _step(spec, program, model, params, optimizer, device_type, mark, gradients_only, forward_backward_only)
            seconds = time.perf_counter() - start
    del buckets
    return seconds


@dataclass
class ProgramResult:
    """The peak of one device program. ``peak`` in bytes, ``seconds`` of the measured step; ``phases`` (simulated
    programs): the bytes live when the step starts, the peak of its forward and backward, the peak of the rest
    of the step (gradients arriving, optimizer step) and the bytes live between the two, or ``None``; ``trace``
    (simulated with ``record``): the bytes live when the step starts and its allocation events
    (:mod:`encoding.memory.replay`)."""

    peak: int
    seconds: float
    phases: Optional[Tuple[int, int, int, int]] = None
    trace: Optional[Tuple[int, List[tuple]]] = None
