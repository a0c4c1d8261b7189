"""Real steps under ``torch.profiler``: the peak of a device program run on real CPU tensors
(:func:`measure_program_cpu`, what the simulator is checked against) and the kernels' workspaces that fake tensors
miss (:func:`learn_workspaces`, ``--calibrate``), both from the ``"Total Allocated"`` of the profiler's memory events.
"""
from __future__ import annotations

import bisect
import functools
import json
import os
import tempfile
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .program import DeviceProgram, ProgramResult, StepSpec, run_program
from .tracker import Workspaces, batch_key

__all__ = ["measure_program_cpu", "learn_workspaces", "calibration_shares", "trace_events"]

#: The profiler range that marks the measured step.
_MARK = "encoding.memory.step"


def trace_events(prof: torch.profiler.profile) -> List[dict]:
    """The chrome-trace events of a finished ``torch.profiler`` session (its memory events among them), read
    through a temporary file that is removed."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            return json.load(f)["traceEvents"]
    finally:
        os.unlink(path)


def _memory_levels(events: List[dict], device: torch.device) -> List[Tuple[float, int]]:
    """``(timestamp, live bytes)`` of the profiler's memory events on ``device``, in time order: the events'
    ``"Total Allocated"``, less the frees the profiler did not see (:func:`_unseen_frees`), from the level before
    the session's first event (the allocator's count is process-wide and outlives a profiler session: tensors of an
    earlier session freed after it ended are still counted)."""
    kind = 1 if device.type == "cuda" else 0
    memory = sorted((e["ts"], e["args"]["Total Allocated"], e["args"].get("Addr"), e["args"].get("Bytes", 0),
                     e.get("tid")) for e in events
                    if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == kind
                    and (kind == 0 or e["args"].get("Device Id") == device.index))
    frees = _unseen_frees(memory, events) if kind == 0 else []
    zero = memory[0][1] - memory[0][3] if memory else 0
    levels, unseen, k = [], 0, 0
    for ts, total, *_ in memory:
        while k < len(frees) and frees[k][0] <= ts:
            unseen += frees[k][1]
            k += 1
        levels.append((ts, total - unseen - zero))
    return levels


def _unseen_frees(memory: List[tuple], events: List[dict]) -> List[Tuple[float, int]]:
    """``(when, bytes)`` of the CPU frees the profiler's count missed, in time order.

    The CPU allocator counts a free only on a thread the profiler follows. A collective's staging buffer (gloo's
    clone of a reduce-scatter input) is freed on whichever thread drops the collective's work last, sometimes a gloo
    worker, so ``"Total Allocated"`` would keep it for the rest of the trace (the C library's own count shows it
    freed). Such a buffer — allocated inside a ``c10d::`` operator and never freed before its address is handed out
    again, or before the trace ends — is taken as freed when that operator returned.
    """
    collectives = sorted((e["ts"], e["ts"] + e["dur"], e.get("tid")) for e in events
                         if e.get("ph") == "X" and str(e.get("name", "")).startswith("c10d::"))
    if not collectives:
        return []
    starts = [start for start, _, _ in collectives]
    live: Dict[object, Tuple[float, int, object]] = {}
    leaked: List[Tuple[float, int, object]] = []
    for ts, _, addr, nbytes, tid in memory:
        if nbytes > 0:
            if addr in live:  # handed out again: its free was not seen
                leaked.append(live[addr])
            live[addr] = (ts, nbytes, tid)
        elif nbytes < 0:
            live.pop(addr, None)
    leaked.extend(live.values())
    longest = max(end - start for start, end, _ in collectives)
    frees = []
    for ts, nbytes, tid in leaked:
        i = bisect.bisect_right(starts, ts) - 1
        while i >= 0 and collectives[i][0] >= ts - longest:
            start, end, thread = collectives[i]
            if ts <= end and thread == tid:
                frees.append((end, nbytes))
                break
            i -= 1
    return sorted(frees)


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
            key = batch_key(e["name"], shapes, share)
            found[key] = max(found.get(key, 0), held)
    return found


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
    return trace_events(prof), seconds


def measure_program_cpu(spec: StepSpec, program: DeviceProgram) -> ProgramResult:
    """Peak bytes of ``program`` run for real on the CPU, from ``torch.profiler`` memory events.

    The profiler starts before the model is built, so ``"Total Allocated"`` is the live bytes of the program; the
    peak is the largest value inside the measured step (and the value when it starts).
    """
    cpu = torch.device("cpu")
    events, seconds = _profile_program(spec, program, cpu)
    return ProgramResult(_profiled_peak(events, cpu), seconds)


def calibration_shares(device: torch.device) -> List[int]:
    """The batch shares :func:`learn_workspaces` runs by default on ``device`` (see there)."""
    threads = max(torch.get_num_threads(), 2) if device.type == "cpu" else 1
    return sorted({1, threads, threads + 1})


def learn_workspaces(spec: StepSpec, shares: Optional[Sequence[int]] = None,
                     device: torch.device = torch.device("cpu")) -> Workspaces:
    """Learn kernels' workspaces from real steps (one per share) of a device that runs a replica.

    Args:
        spec: the step (its callables create tensors on the current default device, which is set to ``device``).
        shares: the batch shares to run (default: 1, and on the CPU ``S = max(T, 2)`` and ``S + 1`` for ``T``
            intra-op threads, on a GPU 2). Beyond them the last segment is extrapolated, so it must not start at one
            sample, where a kernel may pick another algorithm than for two (on one thread, as under ``torchrun``,
            1 and 2 alone planned a 4-sample device 60% over its real peak).
        device: where to run them (the CPU, or a CUDA device: the profiler's CUDA memory events are used).
    """
    if shares is None:
        shares = calibration_shares(device)
    table: Dict[tuple, Dict[int, int]] = {}
    for share in shares:
        program = DeviceProgram("balanced", share, share * 2, source=False, replicas=2)
        events, _ = _profile_program(spec, program, device, record_shapes=True)
        for key, held in _op_workspaces(events, share, _step_span(events), device).items():
            table.setdefault(key, {})[share] = held
    return Workspaces(table)
