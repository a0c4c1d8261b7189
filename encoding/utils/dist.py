"""Distributed helpers: set up ``torch.distributed`` from ``torchrun`` and query/reduce across processes.

Every helper degrades to the single-process answer when ``torch.distributed`` is unavailable or not initialized
(rank 0, world size 1, barrier and reductions are no-ops), so training and evaluation code can call them
unconditionally.

Example:
    >>> # torchrun --nproc_per_node=4 train.py
    >>> distributed = init_distributed_mode()   # False when started with plain `python train.py`
    >>> if is_main_process():
    ...     print("only rank 0 logs")
"""
from __future__ import annotations

import atexit
import datetime
import logging
import os
import sys
from typing import Iterable, List, NoReturn, Optional, Union

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "launched_by_torchrun",
    "launched_world_size",
    "init_distributed_mode",
    "is_dist_avail_and_initialized",
    "get_rank",
    "get_local_rank",
    "get_world_size",
    "is_main_process",
    "barrier",
    "reduce_across_processes",
    "default_backend",
    "ShardSampler",
    "fsdp_units",
    "is_fully_sharded",
]

_REDUCE_OPS = ("sum", "mean", "max", "min")


def default_backend() -> str:
    """``"nccl"`` when CUDA (and NCCL) is available, otherwise ``"gloo"``."""
    if torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


#: The longest collective timeout torch can take (``datetime.timedelta``'s limit), in seconds.
MAX_TIMEOUT_S = datetime.timedelta.max.total_seconds() - 86400


def timeout_problem(seconds: Optional[float], option: str = "--dist-timeout") -> Optional[str]:
    """Why ``seconds`` cannot be a collective timeout (``None``: it can): not a finite number > 0, or past
    :data:`MAX_TIMEOUT_S` (about 2.7 million years)."""
    if seconds is None:
        return None
    if not isinstance(seconds, (int, float)):
        return f"{option} {seconds!r}: must be a number of seconds"
    if not 0 < seconds <= MAX_TIMEOUT_S:
        return f"{option} {seconds:g}: must be a number of seconds > 0 and at most {MAX_TIMEOUT_S:.3g}"
    return None


def launched_by_torchrun() -> bool:
    """Whether ``torchrun`` started this process (``RANK`` and ``WORLD_SIZE`` in the environment), known before any
    process group is made."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched_world_size() -> int:
    """The processes of this run: ``torchrun``'s ``WORLD_SIZE`` (known before the process group starts), else 1."""
    return int(os.environ["WORLD_SIZE"]) if launched_by_torchrun() else 1


def init_distributed_mode(backend: Optional[str] = None, timeout_s: Optional[float] = None) -> bool:
    """Initialize the default process group from the ``torchrun`` environment.

    Reads ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (plus ``MASTER_ADDR``/``MASTER_PORT`` for the ``env://``
    rendezvous). With CUDA it selects ``cuda:LOCAL_RANK`` as the current device.

    Args:
        backend: process-group backend (default: :func:`default_backend`, i.e. nccl on CUDA, gloo on CPU).
        timeout_s: collective timeout in seconds (default: torch's).

    Returns:
        ``True`` when running distributed (also when the group was already initialized), ``False`` when the process
        was not launched by ``torchrun`` (no ``RANK``/``WORLD_SIZE`` in the environment); then nothing is done.

    Raises:
        RuntimeError: the environment is incomplete (e.g. ``MASTER_ADDR`` missing) or ``torch.distributed`` is
            unavailable in this build.
    """
    if is_dist_avail_and_initialized():
        return True
    if not launched_by_torchrun():
        return False
    if not dist.is_available():
        raise RuntimeError("RANK/WORLD_SIZE are set but this PyTorch build has no torch.distributed")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(f"distributed launch is missing environment variable(s) {missing}; start with torchrun")
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(get_local_rank())
    kwargs = {}
    if timeout_s is not None:
        if problem := timeout_problem(timeout_s, "timeout_s"):
            raise ValueError(problem)
        kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size, **kwargs)
    atexit.register(_destroy_at_exit)
    global _LAUNCHED_GROUP
    _LAUNCHED_GROUP = dist.group.WORLD
    return True


#: The process group :func:`init_distributed_mode` started (the scripts' own torchrun run), else ``None``.
_LAUNCHED_GROUP = None


def is_launched_worker() -> bool:
    """Whether this process runs the process group :func:`init_distributed_mode` started from ``torchrun``'s
    environment (and it is still up)."""
    return is_dist_avail_and_initialized() and _LAUNCHED_GROUP is not None and dist.group.WORLD is _LAUNCHED_GROUP


def end_worker(status: int) -> NoReturn:
    """End a ``torchrun`` worker whose run is over with exit status ``status``.

    The ranks meet first when the run succeeded (none closes its connections while another is still in a
    collective), the process group is destroyed, logs and output are flushed, and the process exits with
    ``os._exit``: it skips the interpreter's teardown, in which gloo's threads sometimes abort a finished process
    (SIGABRT, "terminate called without an active exception"), turning a finished run into a failed one. Files the
    run wrote are closed by the run itself.
    """
    _destroy_group(meet=status == 0)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or broken stream: nothing more can be said on it
            pass
    os._exit(status)


def _destroy_at_exit() -> None:
    """Tear the process group down before the interpreter does: left to the C++ destructors at exit, gloo's threads
    sometimes end the process with SIGABRT ("terminate called without an active exception") after a finished
    run."""
    _destroy_group(meet=False)


def _destroy_group(meet: bool) -> None:
    """Destroy the default process group, if any, after the ranks meet (``meet``); a peer that is gone (a failed
    rank closed its connections) leaves nothing to meet or say at the end of a process."""
    if is_dist_avail_and_initialized():
        try:
            if meet:
                dist.barrier()
            dist.destroy_process_group()
        except Exception:
            pass


def is_dist_avail_and_initialized() -> bool:
    """Whether ``torch.distributed`` is available and its default process group is initialized."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank of this process (0 when not distributed)."""
    return dist.get_rank() if is_dist_avail_and_initialized() else 0


def get_local_rank() -> int:
    """Rank on this node, from ``LOCAL_RANK`` (0 when unset)."""
    return int(os.environ.get("LOCAL_RANK", 0))


def get_world_size() -> int:
    """Number of processes (1 when not distributed)."""
    return dist.get_world_size() if is_dist_avail_and_initialized() else 1


def is_main_process() -> bool:
    """True on rank 0 (and always when not distributed): the process that logs and saves checkpoints."""
    return get_rank() == 0


def barrier() -> None:
    """Wait for every process (no-op when not distributed)."""
    if is_dist_avail_and_initialized():
        dist.barrier()


def _collective_device(tensor: Tensor) -> torch.device:
    """NCCL reduces CUDA tensors only; other backends take the tensor where it is."""
    if dist.get_backend() == "nccl" and tensor.device.type != "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return tensor.device


def reduce_across_processes(value: Union[Tensor, float, int], op: str = "sum") -> Union[Tensor, float, int]:
    """All-reduce a tensor or number over every process.

    Args:
        value: a tensor (any device; moved to the current CUDA device for NCCL and back) or a Python number.
        op: ``"sum"``, ``"mean"``, ``"max"`` or ``"min"``.

    Returns:
        A new tensor on ``value``'s device with ``value``'s dtype (``"mean"`` of an integer tensor returns float64), or
        a Python number for a number. Without ``torch.distributed`` the value itself comes back (a copy for tensors).
    """
    if op not in _REDUCE_OPS:
        raise ValueError(f"op must be one of {_REDUCE_OPS}, got {op!r}")
    is_number = not isinstance(value, Tensor)
    tensor = torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64) if is_number \
        else value
    if op == "mean" and not tensor.is_floating_point():
        tensor = tensor.double()
    if is_dist_avail_and_initialized():
        work = tensor.detach().to(_collective_device(tensor), copy=True)
        dist_op = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM,
                   "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        dist.all_reduce(work, op=dist_op)
        if op == "mean":
            work /= get_world_size()
        result = work.to(tensor.device)
    else:
        result = tensor.detach().clone()
    return result.item() if is_number else result


class ShardSampler(torch.utils.data.Sampler):
    """Every ``world_size``-th sample from ``rank``, in order and without padding: for evaluation under
    ``torchrun``, where ``DistributedSampler`` would repeat samples to even out the shards (and count them twice).

    Args:
        dataset: anything with ``len``.
        rank, world_size: default: this process's (:func:`get_rank`, :func:`get_world_size`).
    """

    def __init__(self, dataset, rank: Optional[int] = None, world_size: Optional[int] = None) -> None:
        rank = get_rank() if rank is None else rank
        world_size = get_world_size() if world_size is None else world_size
        self.indices = range(rank, len(dataset), world_size)

    def __iter__(self):
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def _has_parameters(module: torch.nn.Module) -> bool:
    return next(module.parameters(), None) is not None


def _with_parameters(children: Iterable[torch.nn.Module]) -> List[torch.nn.Module]:
    """The modules among ``children`` that have parameters; a container without a ``forward`` of its own
    (``ModuleList``, ``ModuleDict``, which ``fully_shard`` refuses) contributes its elements instead."""
    found: List[torch.nn.Module] = []
    for child in children:
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            found.extend(_with_parameters(child.children()))
        elif _has_parameters(child):
            found.append(child)
    return found


def fsdp_units(model: torch.nn.Module) -> List[torch.nn.Module]:
    """The modules FSDP2's ``fully_shard`` wraps, in wrapping order (innermost first, the root last).

    The rule of ``--strategy fsdp`` (and of the memory planner's ``fsdp``): every child of ``model.backbone`` that
    has parameters (the backbone's stages; the elements of a ``ModuleList`` of stages, e.g. SegFormer's MiT), then
    every other top-level child of ``model`` that has parameters (``classifier``, ``aux_classifier``, necks, ...),
    then ``model`` itself. A model without a ``backbone`` attribute contributes its top-level children only.

    Args:
        model: a segmentation model (or any module).

    Returns:
        the modules to pass to ``fully_shard`` one after the other.
    """
    units: List[torch.nn.Module] = []
    backbone = getattr(model, "backbone", None)
    if isinstance(backbone, torch.nn.Module):
        units.extend(_with_parameters(backbone.children()))
    units.extend(_with_parameters(child for child in model.children() if child is not backbone))
    units.append(model)
    return units


def is_fully_sharded(module: torch.nn.Module) -> bool:
    """Whether ``module`` was wrapped by FSDP2's ``fully_shard`` (its parameters are shards: ``DTensor``\\ s)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)
