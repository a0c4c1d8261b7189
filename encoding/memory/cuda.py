"""Measured peak memory per GPU of one training step under each strategy (``python -m encoding.memory --devices``).

Each strategy runs for real: ``gather`` through ``torch.nn.DataParallel`` with the loss on the output device,
``balanced``/``balanced-auto`` through :class:`~encoding.parallel.DataParallelModel` (with ``chunk_sizes``) and
:class:`~encoding.parallel.DataParallelCriterion`, ``ddp`` as one process per device (NCCL). After one warm-up step
every device's peak statistics are reset and ``torch.cuda.max_memory_allocated`` is read after the measured steps.
"""
from __future__ import annotations

import gc
import os
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from ..parallel import DataParallelCriterion, DataParallelModel
from ..parallel.scatter_gather import get_split_sizes
from .program import StepSpec, step_autocast
from .spec import step_spec

__all__ = ["measure_strategy"]


def _timed_peaks(step, devices: Sequence[int], steps: int) -> Tuple[List[int], float]:
    step()  # warm-up: optimizer state exists afterwards
    for d in devices:
        torch.cuda.synchronize(d)
        torch.cuda.reset_peak_memory_stats(d)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    for d in devices:
        torch.cuda.synchronize(d)
    return [torch.cuda.max_memory_allocated(d) for d in devices], (time.perf_counter() - start) / steps


def _single_process(spec: StepSpec, strategy: str, devices: Sequence[int], batch: int,
                    split: Sequence[int], steps: int) -> Tuple[List[int], float]:
    source = torch.device("cuda", devices[0])
    with torch.device(source):
        model = spec.build_model()
    model.train()
    optimizer = spec.optimizer([p for p in model.parameters() if p.requires_grad])
    if strategy == "gather":
        wrapped = nn.DataParallel(model, device_ids=list(devices))
        criterion = spec.criterion.to(source) if isinstance(spec.criterion, nn.Module) else spec.criterion

        def loss_of(outputs: Any, target: torch.Tensor) -> torch.Tensor:
            return criterion(outputs, target.to(source))
    else:
        wrapped = DataParallelModel(model, list(devices), chunk_sizes=list(split))
        loss_of = DataParallelCriterion(spec.criterion, list(devices))

    def step() -> None:
        args, kwargs = spec.make_inputs(batch)
        with step_autocast(spec, "cuda"):
            loss = loss_of(wrapped(*args, **kwargs), spec.make_target(batch))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed_peaks(step, devices, steps)


def _ddp_worker(rank: int, spec_args: Dict[str, Any], devices: Sequence[int], shares: Sequence[int], steps: int,
                init_file: str, out_dir: str) -> None:
    device = torch.device("cuda", devices[rank])
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=len(devices))
    try:
        spec = step_spec(**spec_args)
        with torch.device(device):
            model = spec.build_model()
        model.train()
        optimizer = spec.optimizer([p for p in model.parameters() if p.requires_grad])
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device])
        criterion = spec.criterion.to(device)

        def step() -> None:
            args, kwargs = spec.make_inputs(shares[rank])
            args, kwargs = [a.to(device) for a in args], {k: v.to(device) for k, v in kwargs.items()}
            with step_autocast(spec, "cuda"):
                loss = criterion(ddp(*args, **kwargs), spec.make_target(shares[rank]).to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        peaks, seconds = _timed_peaks(step, [devices[rank]], steps)
        torch.save({"peak": peaks[0], "seconds": seconds}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def measure_strategy(spec_args: Dict[str, Any], strategy: str, devices: Sequence[int], batch: int,
                     split: Optional[Sequence[int]] = None, steps: int = 1) -> Tuple[List[int], List[int], float]:
    """Measure ``strategy`` on CUDA ``devices``.

    Args:
        spec_args: keyword arguments of :func:`~encoding.memory.spec.step_spec`.
        strategy: ``gather``, ``balanced``, ``balanced-auto`` (give its ``split``) or ``ddp``.
        devices: CUDA indices.
        batch: the total batch.
        split: samples per device (default: the even split).
        steps: measured steps after one warm-up step.

    Returns:
        ``(split, peak bytes per device, seconds per step)``.
    """
    split = list(split) if split is not None else get_split_sizes(batch, len(devices))
    split += [0] * (len(devices) - len(split))
    gc.collect()
    torch.cuda.empty_cache()
    if strategy != "ddp":
        peaks, seconds = _single_process(step_spec(**spec_args), strategy, devices, batch, split, steps)
        return split, peaks, seconds
    with tempfile.TemporaryDirectory() as out_dir:
        init_file = os.path.join(out_dir, "init")
        mp.spawn(_ddp_worker, args=(spec_args, list(devices), split, steps, init_file, out_dir), nprocs=len(devices))
        results = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=True) for r in range(len(devices))]
    return split, [r["peak"] for r in results], max(r["seconds"] for r in results)
