"""The simulated timeline against real allocations: the same device program run on real CPU tensors under
``torch.profiler`` (``profile_memory``: every allocation and free of the CPU allocator, with its address; frees
on threads the profiler does not follow are recovered as :mod:`encoding.memory.profiler` does), aligned event for
event with the simulated step.

:func:`measure_timeline_cpu` gives the real step's memory events; :func:`align` matches each simulated allocation with
the next real allocation of the same size, and each simulated free with the free of that address; real allocations
the simulation has no event for (a kernel's internal buffer, freed inside the operator) are kept apart as
``extra``. :func:`compare` gives the peaks, their moments (as simulated events) and the differences at every event.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .program import DISTRIBUTED, DeviceProgram, StepSpec, device_programs
from .profiler import _memory_levels, _profile_program, _step_span
from .simulate import simulate_program
from .tracker import MIB, rounded

__all__ = ["RealStep", "measure_timeline_cpu", "measure_timeline_cuda", "cuda_step", "simulated_events", "align",
           "compare", "distinct_programs", "COLUMNS", "row"]

#: How far past a simulated event the alignment looks for its real counterpart (real events).
LOOKAHEAD = 64


@dataclass
class RealStep:
    """A real step's allocator events: ``(address, bytes)`` (negative: a free) and the bytes live after each,
    and the bytes live when the step starts."""

    events: List[Tuple[Any, int]]
    levels: List[int]
    start: int


def measure_timeline_cpu(spec: StepSpec, program: DeviceProgram) -> RealStep:
    """Run ``program`` for real on the CPU under ``torch.profiler`` (started before the model is built) and return
    its measured step's allocator events."""
    cpu = torch.device("cpu")
    trace, _ = _profile_program(spec, program, cpu)
    begin, end = _step_span(trace)
    memory = sorted((e["ts"], e["args"]["Total Allocated"], e["args"].get("Addr"), e["args"].get("Bytes", 0),
                     e.get("tid")) for e in trace
                    if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == 0)
    levels = _memory_levels(trace, cpu)  # the same order, with the frees the profiler missed
    before = [level for (ts, *_), (_, level) in zip(memory, levels) if ts < begin]
    inside = [(m, level) for m, (_, level) in zip(memory, levels) if begin <= m[0] <= end]
    return RealStep([(m[2], m[3]) for m, _ in inside], [level for _, level in inside], before[-1] if before else 0)


def measure_timeline_cuda(spec: StepSpec, program: DeviceProgram, device: torch.device) -> RealStep:
    """Run ``program`` for real on CUDA ``device`` and return its measured step's allocations and frees as the
    caching allocator recorded them (``torch.cuda.memory._record_memory_history`` during the step, read from
    ``torch.cuda.memory._snapshot()``); a ``ddp`` rank's buckets are modelled as the simulator does (one process)."""
    from .program import run_program

    state: Dict[str, Any] = {}

    @contextlib.contextmanager
    def window() -> Iterator[None]:
        torch.cuda.synchronize(device)
        state["start"] = torch.cuda.memory_allocated(device)
        torch.cuda.memory._record_memory_history("all", context=None, max_entries=4_000_000)
        try:
            yield
        finally:
            torch.cuda.synchronize(device)
            state["snapshot"] = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(None)

    with torch.device(device):
        run_program(spec, program, "cuda", window)
    return cuda_step(state["snapshot"], device.index or 0, state["start"])


def cuda_step(snapshot: Dict[str, Any], index: int, start: int) -> RealStep:
    """The allocations (``alloc``) and frees (``free_completed``) of device ``index`` in a memory snapshot's trace,
    the bytes live after each counted from ``start``."""
    events, levels, live = [], [], start
    for entry in snapshot["device_traces"][index]:
        if entry["action"] in ("alloc", "free_completed"):
            size = entry["size"] if entry["action"] == "alloc" else -entry["size"]
            live += size
            events.append((entry["addr"], size))
            levels.append(live)
    return RealStep(events, levels, start)


def simulated_events(spec: StepSpec, program: DeviceProgram, round_to: int = 1) -> Tuple[int, List[tuple], int]:
    """The simulated step's ``(start bytes, events, peak)`` (``round_to=1``: the CPU allocator's sizes)."""
    result = simulate_program(spec, program, round_to, record=True)
    return result.trace[0], result.trace[1], result.peak


#: Storages smaller than this (bytes) are left out of the alignment: scalars whose order inside one operator
#: differs between a kernel and its fake twin (a loss's total weight, a reduction's result).
MIN_BYTES = 1024


@dataclass
class Alignment:
    """The simulated and the real step as the same sequence of storages of at least ``min_bytes``.

    Attributes:
        tokens: the simulated step's ``("a" | "f", bytes, event)``: its allocations and frees of such storages, with
            the index of the event among those that change memory (the timeline's x).
        real: per token, the index of its real counterpart in :attr:`RealStep.events` (``None``: not found).
        simulated_level / real_level: per token, the bytes of such storages live after it (real: less the real
            allocations the simulation has no storage for, a kernel's own buffers, alive then).
    """

    tokens: List[Tuple[str, int, int]]
    real: List[Optional[int]]
    simulated_level: List[int]
    real_level: List[Optional[int]]


def align(events: List[tuple], real: RealStep, min_bytes: int = MIN_BYTES, round_to: int = 1,
          positions: Optional[Dict[int, int]] = None) -> Alignment:
    """Match the simulated ``events`` with ``real``'s, storage for storage, in order (sizes rounded up to
    ``round_to``: 1 on the CPU, 512 for the CUDA caching allocator's blocks); ``positions``: each event's place in
    a timeline (:attr:`~encoding.memory.timeline.ProgramTimeline.positions`), default its place among the events
    that change memory."""
    tokens, sizes, x = [], {}, -1
    for index, event in enumerate(events):
        x = positions[index] if positions is not None else x + (event[0] != "m")
        if event[0] == "a" and event[1] >= min_bytes:
            sizes[index] = rounded(event[1], round_to)
            tokens.append(("a", sizes[index], x, index))
        elif event[0] == "f" and event[1] in sizes:
            tokens.append(("f", sizes.pop(event[1]), x, event[1]))
    out = Alignment([t[:3] for t in tokens], [], [], [])
    simulated_span, _ = _lives([(kind, alloc) for kind, _, _, alloc in tokens])
    real_span, real_free = _lives(_real_events(real.events, min_bytes))
    address: Dict[int, Any] = {}  # simulated allocation -> real address
    allocated: Dict[int, int] = {}  # simulated allocation -> its real allocation's event
    live: Dict[Any, int] = {}  # real addresses matched and live
    level, j, used = 0, 0, set()
    for position, (kind, size, _, alloc) in enumerate(tokens):
        level += size if kind == "a" else -size
        target = address.get(alloc)
        if kind == "a":
            candidates = [k for k in range(j, min(len(real.events), j + LOOKAHEAD))
                          if real.events[k][1] == size and k not in used]
            found = _outliving(candidates, simulated_span[position], real_span)
        else:  # the free of the real allocation (an address is handed out again): frees may come in another
            # order, Python drops a fake storage when its last reference goes
            found = real_free.get(allocated.get(alloc, -1))
            if found is not None and not max(0, j - LOOKAHEAD) <= found < j + LOOKAHEAD:
                found = None
        if found is not None:
            used.add(found)
            if kind == "a":
                address[alloc], allocated[alloc] = real.events[found][0], found
                live[address[alloc]] = size
            else:
                live.pop(target, None)
            j = max(j, found + 1)
        out.real.append(found)
        out.simulated_level.append(level)
        out.real_level.append(None if found is None else sum(live.values()))
    return out


def _lives(events: List[Tuple[str, Any]]) -> Tuple[List[int], Dict[int, int]]:
    """Per ``("a", key)`` event (an allocation): the allocations made while it lives, to the ``("f", key)`` that frees
    it or to the end; and, by allocation, the event that frees it. Other events (``("-", None)``) only hold a place."""
    spans, frees, opened = [0] * len(events), {}, {}
    allocations = 0
    for index, (kind, key) in enumerate(events):
        if kind == "a":
            opened[key] = (index, allocations)
            allocations += 1
        elif kind == "f" and key in opened:
            where, before = opened.pop(key)
            spans[where], frees[where] = allocations - before - 1, index
    for where, before in opened.values():
        spans[where] = allocations - before - 1
    return spans, frees


def _real_events(events: List[Tuple[Any, int]], min_bytes: int) -> List[Tuple[str, Any]]:
    """A real step's events as :func:`_lives` reads them: allocations of at least ``min_bytes`` and frees, by
    address."""
    return [("a", addr) if nbytes >= min_bytes else ("f", addr) if nbytes < 0 else ("-", None)
            for addr, nbytes in events]


def _outliving(candidates: List[int], needed: int, real_span: List[int]) -> Optional[int]:
    """The real allocation standing for a simulated one: the first candidate living while as many storages are
    allocated as the simulated one does. A kernel's buffer of the same size freed inside its operator (oneDNN's
    blocked copy of a convolution's output on an AVX2 CPU, reordered into the output) lives through fewer; without
    such a candidate, the one living longest."""
    if not candidates:
        return None
    return next((k for k in candidates if real_span[k] >= needed), max(candidates, key=lambda k: real_span[k]))


def compare(start: int, events: List[tuple], real: RealStep, min_bytes: int = MIN_BYTES,
            round_to: int = 1, timeline: Any = None) -> Dict[str, Any]:
    """Peaks and their moments, simulated and real, and whether the two steps are the same storages in order.
    With ``timeline`` (the :class:`~encoding.memory.timeline.ProgramTimeline` of ``events``), the simulated
    levels are its own: learned workspaces included.

    Returns:
        ``simulated_peak`` / ``real_peak`` (bytes, every storage), ``error`` (real over simulated less one),
        ``simulated_moment`` (the first event at the simulated peak, -1: the start), ``real_moment`` (the last
        matched simulated event at or before the real peak), ``real_at_simulated_moment`` (the most the real step
        holds from the last matched storage before the simulated peak to the second after it: a learned workspace is
        drawn before its operator's outputs, which it includes) and ``moment_error`` (that over the real peak less
        one: how far the real step is from its peak at the simulated moment), ``events`` (changing memory),
        ``tokens`` (allocations and frees of storages of at least ``min_bytes``), ``matched`` (of them found in the
        real step, in order), ``largest_gap`` (bytes of such storages: the largest difference after a matched token)
        and ``start_gap`` (real less simulated bytes when the step starts).
    """
    aligned = align(events, real, min_bytes, round_to, timeline.positions if timeline is not None else None)
    levels = timeline.totals() if timeline is not None else _levels(start, events, round_to)
    sim_peak = max([start] + levels)
    sim_moment = levels.index(sim_peak) if sim_peak > start else -1
    real_peak = max([real.start] + real.levels)
    peak_at = real.levels.index(real_peak) if real_peak > real.start else -1
    real_moment = max((t[2] for t, r in zip(aligned.tokens, aligned.real) if r is not None and r <= peak_at),
                      default=-1)
    before = [r for t, r in zip(aligned.tokens, aligned.real) if r is not None and t[2] <= sim_moment]
    after = [r for t, r in zip(aligned.tokens, aligned.real) if r is not None and t[2] > sim_moment][:2]
    window = real.levels[before[-1] if before else 0:(after[-1] if after else len(real.levels) - 1) + 1]
    at_moment = max(window) if window else real.start
    gaps = [abs(r - s) for r, s in zip(aligned.real_level, aligned.simulated_level) if r is not None]
    return {"simulated_peak": sim_peak, "real_peak": real_peak, "error": real_peak / sim_peak - 1,
            "simulated_moment": sim_moment, "real_moment": real_moment, "events": len(levels),
            "real_at_simulated_moment": at_moment, "moment_error": at_moment / real_peak - 1,
            "tokens": len(aligned.tokens), "matched": sum(r is not None for r in aligned.real),
            "largest_gap": max(gaps, default=0), "start_gap": real.start - start}


def _levels(start: int, events: List[tuple], round_to: int) -> List[int]:
    """Bytes live after each event that changes memory (sizes rounded up to ``round_to``)."""
    levels, live, sizes = [], start, {}
    for index, event in enumerate(events):
        if event[0] == "m":
            continue
        if event[0] == "a":
            sizes[index] = rounded(event[1], round_to)
            live += sizes[index]
        elif event[0] == "f":
            live -= sizes.pop(event[1])
        elif event[0] == "r":
            live += rounded(event[2], round_to) - sizes[event[1]]
            sizes[event[1]] = rounded(event[2], round_to)
        else:
            live += event[1]
        levels.append(live)
    return levels


def distinct_programs(strategies: Sequence[str], devices: int, per_device: int) -> Dict[str, DeviceProgram]:
    """The distinct device programs of ``strategies`` on ``devices`` devices with ``per_device`` samples each, by
    name (``"gather, device 0"``, ``"gather, devices 1-7"``, ``"ddp, every rank"``)."""
    out: Dict[str, DeviceProgram] = {}
    for strategy in strategies:
        programs = device_programs(strategy, [per_device] * devices)
        if all(p == programs[0] for p in programs):
            out[f"{strategy}, every {'rank' if strategy in DISTRIBUTED else 'device'}"] = programs[0]
            continue
        out[f"{strategy}, device 0"] = programs[0]
        if devices > 1:
            out[f"{strategy}, devices 1-{devices - 1}" if devices > 2 else f"{strategy}, device 1"] = programs[1]
    return out


#: The columns of :func:`row` (MiB; errors in %).
COLUMNS = ["program", "simulated peak", "real peak", "error", "real at the simulated moment", "moment error",
           "storages matched", "largest gap"]


def row(name: str, result: Dict[str, Any]) -> List[str]:
    """One table row of :func:`compare`'s result (see :data:`COLUMNS`)."""
    return [name, f"{result['simulated_peak'] / MIB:.1f}", f"{result['real_peak'] / MIB:.1f}",
            f"{100 * result['error']:+.2f}%", f"{result['real_at_simulated_moment'] / MIB:.1f}",
            f"{100 * result['moment_error']:+.2f}%", f"{result['matched']}/{result['tokens']}",
            f"{result['largest_gap'] / MIB:.2f}"]
