"""Real multi-process measurement of the ``ddp``, ``fsdp`` and ``zero1`` strategies: one CPU process per rank in a
gloo group, each measuring its own peak with ``torch.profiler`` memory events (:func:`measure_ranks_cpu`), the
ground truth the simulated ranks are checked against (``benchmarks/bench_memory.py sharded``,
``tests/test_memory_plan.py``).
"""
from __future__ import annotations

import gc
import os
import queue as queue_module
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..utils.dist import end_worker
from .profiler import measure_program_cpu
from .program import ProgramResult, StepSpec, device_programs

__all__ = ["measure_ranks_cpu"]


def measure_ranks_cpu(make_spec: Callable[..., StepSpec], spec_kwargs: Dict[str, Any], strategies: Sequence[str],
                      split: Sequence[int], threads: int = 1, timeout: float = 1800.0
                      ) -> Dict[str, List[ProgramResult]]:
    """Each rank's real CPU peak of each strategy with samples per rank ``split``: per strategy, ``len(split)`` new
    processes (:func:`_rank_context`) in a gloo group, each running its device program under ``torch.profiler``
    (new processes per strategy: nothing another strategy's run left behind counts).

    Args:
        make_spec: a module-level function (the processes are new: it is pickled by name) returning the step,
            called in every process with ``spec_kwargs``.
        spec_kwargs: its keyword arguments (picklable).
        strategies: from ``"ddp"``, ``"fsdp"`` and ``"zero1"``.
        split: samples per rank.
        threads: intra-op threads per process.
        timeout: seconds to wait for the processes of one strategy.

    Returns:
        strategy -> one result per rank.

    Raises:
        RuntimeError: a rank failed (its traceback in the message) or did not finish in time.
    """
    bad = [s for s in strategies if s not in ("ddp", "fsdp", "zero1")]
    if bad or not strategies:
        raise ValueError(f"measure_ranks_cpu: strategies must be from ddp, fsdp, zero1, got {list(strategies)!r}")
    return {strategy: _measure_ranks(make_spec, spec_kwargs, strategy, list(split), threads, timeout)
            for strategy in strategies}


def _measure_ranks(make_spec: Callable[..., StepSpec], spec_kwargs: Dict[str, Any], strategy: str,
                   split: List[int], threads: int, timeout: float) -> List[ProgramResult]:
    context = _rank_context()
    queue = context.Queue()
    with tempfile.TemporaryDirectory() as folder:
        init = "file://" + os.path.join(folder, "store")
        processes = [context.Process(target=_rank_main, args=(rank, split, strategy, init, make_spec, spec_kwargs,
                                                               threads, queue))
                     for rank in range(len(split))]
        for process in processes:
            process.start()
        results: Dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(results) < len(processes):
                try:
                    rank, result = queue.get(timeout=1.0)
                except queue_module.Empty:
                    _check_alive(processes, results, strategy, deadline)
                    continue
                if isinstance(result, str):
                    raise RuntimeError(f"rank {rank} of the {strategy} measurement failed:\n{result}")
                results[rank] = result
        finally:
            for process in processes:
                process.join(timeout=60)
                if process.is_alive():
                    process.kill()
    return [ProgramResult(*results[rank]) for rank in range(len(split))]


def _rank_context() -> Any:
    """How the ranks start: forked from a ``forkserver`` that imported this module (torch, ``encoding``) once and ran
    nothing, so each rank is a fresh process without importing them again (seconds a rank); spawned where there is
    no ``forkserver`` (Windows)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def _check_alive(processes: List[Any], results: Dict[int, Any], strategy: str, deadline: float) -> None:
    """Raise when a rank died without reporting (it could not start: nothing will come) or time is up."""
    for rank, process in enumerate(processes):
        if rank not in results and not process.is_alive() and process.exitcode != 0:
            raise RuntimeError(f"rank {rank} of the {strategy} measurement exited with code {process.exitcode} "
                               "before reporting (see its output above)")
    if time.monotonic() > deadline:
        raise RuntimeError(f"the {strategy} measurement did not finish in time")


def _rank_main(rank: int, split: List[int], strategy: str, init: str, make_spec: Callable[..., StepSpec],
               spec_kwargs: Dict[str, Any], threads: int, queue: Any) -> None:
    torch.set_num_threads(threads)
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=len(split))
        try:
            result = measure_program_cpu(make_spec(**spec_kwargs), device_programs(strategy, split)[rank])
            dist.barrier()  # no rank tears the group down while another is still in a collective
        finally:
            gc.collect()  # the wrapped model (FSDP keeps reference cycles) goes before its process group
            dist.destroy_process_group()
        queue.put((rank, (result.peak, result.seconds)))
    except Exception:  # reported to the parent, which raises it
        queue.put((rank, traceback.format_exc()))
    queue.close()
    queue.join_thread()  # the report is in the pipe: a rank that exits without one could not even start
    end_worker(0)  # past the interpreter's teardown, where gloo's threads sometimes abort a finished rank
