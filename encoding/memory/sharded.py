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

__all__ = ["rank_world", "shard_model", "is_sharded", "zero_optimizer", "zero_partitions", "LocalShardOptimizer"]


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
    return model


def is_sharded(model: nn.Module) -> bool:
    """Whether :func:`shard_model` (``fully_shard``) sharded ``model``."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


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


def zero_partitions(params: List[Tensor], world_size: int) -> List[Tuple[int, ...]]:
    """The sizes (elements) of the parameters each of ``world_size`` ranks owns under ``ZeroRedundancyOptimizer``
    (ranks with equal partitions hold equal optimizer state)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    with rank_world(world_size, 0):
        zero = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=0.01)
        partitions = zero._partition_parameters()
    return [tuple(sorted(p.numel() for group in rank for p in group["params"])) for rank in partitions]


class LocalShardOptimizer:
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

    def step(self) -> None:
        """One optimizer step on the local shards of the parameters and of their gradients."""
        for param, local in zip(self.params, self.local):
            local.grad = None if param.grad is None else param.grad.to_local()
        self.optimizer.step()
        for local in self.local:
            local.grad = None

    @property
    def state(self) -> Dict[Tensor, Dict[str, Any]]:
        """The per-parameter state (of the local shards), as a torch optimizer's ``state``."""
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (``set_to_none`` only: the step loop's)."""
        for param in self.params:
            param.grad = None
