"""The sharded strategies' pieces, shared by the simulator and the real multi-process measurement: the process group
a rank's program runs in (:func:`rank_world`), FSDP2's wrapping (:func:`shard_model`) and ZeRO-1's optimizer
(:func:`zero_optimizer`).

``fsdp`` is ``torch.distributed.fsdp.fully_shard`` (reshard after forward) on every unit of
:func:`encoding.utils.dist.fsdp_units` (the backbone's stages, the heads, then the root): each rank holds its padded
shard of the parameters, gradients (reduce-scattered) and optimizer state, and a unit's whole parameters only while
that unit runs forward or backward. ``zero1`` is ``DistributedDataParallel`` (whole parameters and gradients, DDP's
buckets) with ``torch.distributed.optim.ZeroRedundancyOptimizer``: each rank holds the optimizer state of its own
partition of the parameters. Both run torch's own code: in the simulator on fake tensors in a fake process group of
the program's world size and rank (torch's ``"fake"`` backend: collectives do nothing, the buffers around them are
allocated as on a real rank, and :func:`shard_model` adds what gloo stages), in :mod:`encoding.memory.ranks` in a
real gloo group.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..utils.dist import fsdp_units

__all__ = ["rank_world", "shard_model", "is_sharded", "zero_optimizer", "zero_partitions", "LocalShardOptimizer",
           "PartitionOptimizer", "chunk_views", "chunks_on_demand", "rank_view", "sharded_gradients"]


@contextlib.contextmanager
def rank_world(world_size: Optional[int], rank: int = 0, backend: str = "fake") -> Iterator[None]:
    """Run as ``rank`` of ``world_size`` processes: in this process's group if it has one (its size and rank must
    match; ``world_size=None``: any group), else in a new group of ``backend`` (``"fake"``: torch's fake process
    group; ``"gloo"``: a one-process group), destroyed on exit so that later code does not look distributed.

    Raises:
        ValueError: this process is already in a group of another size or rank.
    """
    if dist.is_initialized():
        if world_size is not None and (dist.get_world_size(), dist.get_rank()) != (world_size, rank):
            raise ValueError(f"this process is rank {dist.get_rank()} of {dist.get_world_size()}; the program is "
                             f"rank {rank} of {world_size}: simulate sharded strategies outside torch.distributed")
        yield
        return
    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def shard_model(model: nn.Module, staged_collectives: bool = False) -> nn.Module:
    """``fully_shard`` (reshard after forward) on each of :func:`~encoding.utils.dist.fsdp_units`, innermost first,
    over a CPU device mesh of the current process group.

    Args:
        model: the model to shard (in place).
        staged_collectives: each all-gather and reduce-scatter holds, while it runs, the buffer gloo stages it in
            (the whole all-gather output; a clone of the whole reduce-scatter input): the simulator's stand-in for a
            real gloo group, whose collectives its fake process group does not run. NCCL works in place.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():  # the mesh is real (a few integers), also in the simulator's fake mode
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for unit in fsdp_units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
        if staged_collectives:
            unit.set_custom_all_gather(_StagedAllGather())
            unit.set_custom_reduce_scatter(_StagedReduceScatter())
    # FSDP2's lazy initialisation (the first forward's) now: it re-pads a shard shorter than the padded size when its
    # storage is not the padded one, which a fake tensor (no data pointer) never seems to be; a step would count that
    # copy as its own allocation, which a real rank (same storage: nothing to do) never makes
    model._get_fsdp_state()._lazy_init()
    return model


class chunk_views:  # noqa: N801  (a sequence, named like the function it stands for)
    """``torch.chunk(tensor, count, dim)`` padded with empty tensors to ``count`` chunks (FSDP2's
    ``_chunk_with_empty``), each chunk made when it is read: ``fully_shard`` reads two of them (this rank's and the
    first), and making all ``count`` of them costs a fake-tensor operator each (the minutes of sharding a model for
    1024 simulated ranks). Chunk ``i`` is the view ``torch.chunk`` gives (the same storage, offset, size and
    strides: ``narrow`` by ``ceil(size / count)``)."""

    def __init__(self, tensor: Tensor, count: int, dim: int) -> None:
        self.tensor, self.count, self.dim = tensor, count, dim
        size = tensor.size(dim)
        self.step = -(-size // count) if size else 0
        self.made = -(-size // self.step) if self.step else 0  # the chunks torch.chunk makes (the rest are empty)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> Tensor:
        if not -self.count <= index < self.count:
            raise IndexError(f"chunk {index} of {self.count}")
        index %= self.count
        if index >= self.made:
            return self[0].new_empty(0) if self.made else self.tensor.narrow(self.dim, 0, 0)
        start = index * self.step
        return self.tensor.narrow(self.dim, start, min(self.step, self.tensor.size(self.dim) - start))


@contextlib.contextmanager
def chunks_on_demand() -> Iterator[None]:
    """Inside: ``fully_shard`` chunks each parameter with :class:`chunk_views` (the chunks it reads, made when read)
    instead of all of them: the same shards, in a time that does not grow with the world size. The simulator shards
    its fake models so; a real run (:mod:`encoding.memory.ranks`) uses torch's own."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    original = _fsdp_param._chunk_with_empty
    _fsdp_param._chunk_with_empty = chunk_views
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original


def is_sharded(model: nn.Module) -> bool:
    """Whether :func:`shard_model` (``fully_shard``) sharded ``model``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _param_groups(model: nn.Module) -> List[Any]:
    """The FSDP2 parameter groups of a model sharded by :func:`shard_model`, one per unit that holds parameters."""
    from torch.distributed.fsdp import FSDPModule

    groups = (m._get_fsdp_state()._fsdp_param_group for m in model.modules() if isinstance(m, FSDPModule))
    return [group for group in groups if group is not None]


@contextlib.contextmanager
def rank_view(model: nn.Module, world_size: int, rank: int) -> Iterator[None]:
    """Inside: ``model``, sharded by :func:`shard_model` as any rank of ``world_size``, holds the shards of
    ``rank``: each parameter's local tensor the first rows of its padded shard that ``rank``'s ``torch.chunk`` has
    (FSDP2's layout: every rank's shard is padded to the first chunk's size and its local tensor is the narrowed
    rows, so only the local tensors differ between ranks). For the rest of a step alone (the optimizer of those
    shards) without sharding a model for each rank."""
    from torch._prims_common import make_contiguous_strides_for

    saved = []
    try:
        for group in _param_groups(model):
            for param in group.fsdp_params:
                if param.fsdp_placement.dim != 0:
                    raise ValueError(f"rank_view: a parameter sharded on dim {param.fsdp_placement.dim}, not 0")
                rows = param._orig_size[0]
                step = -(-rows // world_size)
                size = torch.Size((max(0, min(step, rows - rank * step)),) + tuple(param._orig_size[1:]))
                dtensor = param.sharded_param
                saved.append((param, dtensor._local_tensor, param.sharded_size, param.contiguous_sharded_stride))
                padded = param._sharded_param_data.view(param.padded_sharded_param_size)
                dtensor._local_tensor = padded.narrow(0, 0, size[0])
                param.sharded_size, param.contiguous_sharded_stride = size, make_contiguous_strides_for(size)
        yield
    finally:
        for param, local, size, stride in saved:
            param.sharded_param._local_tensor = local
            param.sharded_size, param.contiguous_sharded_stride = size, stride


def sharded_gradients(model: nn.Module) -> None:
    """What the backward of a model sharded by :func:`shard_model` leaves, without running it (``run_program``'s
    ``gradients_only``): per unit the flat output of its reduce-scatter (every trainable parameter's padded shard),
    each parameter's gradient a ``DTensor`` of its shard's view into it, as FSDP2's ``foreach_reduce`` leaves them."""
    for group in _param_groups(model):
        params = [p for p in group.fsdp_params if p.sharded_param.requires_grad]
        if not params:
            continue
        local = params[0].sharded_param.to_local()
        flat = torch.empty(sum(p.padded_sharded_param_size.numel() for p in params), dtype=local.dtype,
                           device=local.device)
        offset = 0
        for p in params:
            view = torch.as_strided(flat, p.sharded_size, p.contiguous_sharded_stride, offset)
            p.sharded_param.grad = p.to_sharded_dtensor(view)
            offset += p.padded_sharded_param_size.numel()


class _StagedComm:
    """An FSDP2 custom comm (``set_custom_all_gather`` / ``set_custom_reduce_scatter`` take any object with
    ``allocate`` and ``__call__``) that holds, while the collective runs, the buffer gloo stages it in."""

    def allocate(self, size: Tuple[int, ...], *, dtype: torch.dtype, device: torch.device) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class _StagedAllGather(_StagedComm):
    """gloo's ``all_gather_single``: a flat output of the whole size, copied out when the collective ends."""

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> Optional[dist.Work]:
        staging = torch.empty_like(output_tensor)  # noqa: F841  (held while the collective runs)
        return dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)


class _StagedReduceScatter(_StagedComm):
    """gloo's ``reduce_scatter_single``: a clone of the whole input, all-reduced in place, this rank's chunk copied
    out."""

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup, op: object,
                 async_op: bool = False) -> Optional[dist.Work]:
        staging = torch.empty_like(input_tensor)  # noqa: F841  (held while the collective runs)
        return dist.reduce_scatter_single(output=output_tensor, input=input_tensor, group=group, op=op,
                                          async_op=async_op)


def zero_optimizer(params: List[Tensor], make: Callable[[List[Tensor]], torch.optim.Optimizer]
                   ) -> torch.optim.Optimizer:
    """``ZeroRedundancyOptimizer`` over ``params`` with the class and settings of ``make(params)``: this rank
    keeps the state of its own partition."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    probe = make(params)  # its class and defaults; no state is made before a step
    return ZeroRedundancyOptimizer(params, optimizer_class=type(probe), **probe.defaults)


def _zero_param_lists(params: List[Tensor], world_size: int) -> List[List[Tensor]]:
    """Per rank, the parameters it owns under ``ZeroRedundancyOptimizer`` (torch's own partitioning), in this
    process's group when it has ``world_size`` ranks, else in a fake one."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    inside = dist.is_initialized() and dist.get_world_size() == world_size
    with contextlib.nullcontext() if inside else rank_world(world_size, 0):
        zero = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=0.01)
        return [[p for group in rank for p in group["params"]] for rank in zero._partition_parameters()]


def zero_partitions(params: List[Tensor], world_size: int) -> List[Tuple[int, ...]]:
    """The sizes (elements) of the parameters each of ``world_size`` ranks owns under ``ZeroRedundancyOptimizer``
    (ranks with equal partitions hold equal optimizer state)."""
    return [tuple(sorted(p.numel() for p in rank)) for rank in _zero_param_lists(params, world_size)]


def _warm_up(optimizer: torch.optim.Optimizer, tensors: List[Tensor]) -> None:
    for tensor in tensors:
        tensor.grad = torch.zeros_like(tensor)
    optimizer.step()
    for tensor in tensors:
        tensor.grad = None


class _SimulatedOptimizer:
    """What the simulated optimizers share: ``params`` (every parameter whose gradient the step drops) and
    ``optimizer`` (the torch optimizer they step)."""

    params: List[Tensor]
    optimizer: torch.optim.Optimizer

    @property
    def state(self) -> Dict[Tensor, Dict[str, Any]]:
        """The per-parameter state of the tensors stepped, as a torch optimizer's ``state``."""
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop every parameter's gradient (``set_to_none`` only: the step loop's)."""
        for param in self.params:
            param.grad = None


class PartitionOptimizer(_SimulatedOptimizer):
    """A simulated ``zero1`` rank's optimizer: ``make`` over the parameters this rank owns under
    ``ZeroRedundancyOptimizer`` (the optimizer ZeRO steps on this rank, the same state and the same step), and
    ``zero_grad`` dropping every parameter's gradient (ZeRO's). ZeRO's broadcast of each rank's parameters after the
    step works in place (no memory) but costs a call per parameter and rank on a fake process group: the seconds of
    a 1024-rank simulation. The real measurement (:mod:`encoding.memory.ranks`) runs ZeRO itself.

    Args:
        params: every trainable parameter, in the module's order.
        world_size, rank: the rank (default: this process's, in its group).
        make: ``params -> optimizer``.
    """

    def __init__(self, params: List[Tensor], make: Callable[[List[Tensor]], torch.optim.Optimizer],
                 world_size: Optional[int] = None, rank: Optional[int] = None) -> None:
        world_size = dist.get_world_size() if world_size is None else world_size
        rank = dist.get_rank() if rank is None else rank
        self.params = params
        self.owned = _zero_param_lists(params, world_size)[rank]
        self.optimizer = make([{"params": self.owned}])  # a group, as ZeRO makes it: a rank may own none

    def step(self) -> None:
        """The step of this rank's partition."""
        self.optimizer.step()

    def warm_up(self) -> None:
        """What a warm-up step leaves: the state of the owned parameters (from zero gradients, dropped after)."""
        _warm_up(self.optimizer, self.owned)

class LocalShardOptimizer(_SimulatedOptimizer):
    """The optimizer of ``fsdp``'s sharded parameters run on their local shards (views of the same storages) and
    their gradients' local shards: the same tensors as on the ``DTensor`` parameters, without ``DTensor``'s
    per-operator sharding propagation (what makes a simulated ``fsdp`` step slow). The simulator uses it; the real
    measurement steps the ``DTensor`` parameters.

    Args:
        params: the sharded parameters (``DTensor``).
        make: ``local tensors -> optimizer``.
    """

    def __init__(self, params: List[Tensor], make: Callable[[List[Tensor]], torch.optim.Optimizer]) -> None:
        self.params = params
        self.local = [p.to_local().detach() for p in params]
        self.optimizer = make(self.local)

    def warm_up(self) -> None:
        """What a warm-up step leaves: the state of the local shards (from zero gradients, dropped after)."""
        _warm_up(self.optimizer, self.local)

    def step(self) -> None:
        """One optimizer step on the local shards of the parameters and of their gradients."""
        for param, local in zip(self.params, self.local):
            local.grad = None if param.grad is None else param.grad.to_local()
        self.optimizer.step()
        for local in self.local:
            local.grad = None
