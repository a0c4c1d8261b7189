"""The memory of each device over one training step, from the simulation that gives the reported peak.

The simulator runs the step under a :class:`~encoding.memory.timeline_labels.Labeler`, which tells what each storage
is (parameters, gradients, optimizer state, activations kept for backward, outputs, communication buffers,
temporaries) and what made it. :func:`program_timeline` turns one device program's recorded events into a stack of
bytes by kind at every event (:class:`ProgramTimeline`), its peak checked equal to the simulator's;
:func:`build_timeline` does it for every strategy and device; :func:`timeline` is the Python API and
:func:`write_timeline` writes ``timeline.json`` and, with :mod:`encoding.memory.timeline_draw`, ``timeline.png`` and
``timeline.html``. ``python -m encoding.memory ... --timeline DIR`` calls :func:`write_report_timeline`.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..utils.files import atomic_write
from .balance import _strategy_split
from .program import DISTRIBUTED, DeviceProgram, StepSpec, device_programs
from .simulate import Simulator
from .timeline_labels import KIND_NAMES, KINDS, Labeler
from .tracker import CUDA_BLOCK, MIB, rounded

#: The largest storages alive at the peak that the timeline names.
LARGEST = 8

__all__ = ["KINDS", "KIND_NAMES", "Labeler", "ProgramTimeline", "program_timeline", "build_timeline", "timeline",
           "write_timeline", "write_report_timeline", "check_options", "timeline_png"]


@dataclass
class ProgramTimeline:
    """One device program's step, one point per event that changes the bytes held.

    Attributes:
        start: bytes held when the step starts, by kind.
        kinds: per event, the index in :data:`KINDS` of the storage it allocates, frees or resizes.
        deltas: per event, the bytes it adds (negative: frees).
        makers: per event, what made the storage (a module, ``"<module> backward"``, the optimizer step).
        phases: ``(phase, first event)`` of forward, backward, gradients and the optimizer step.
        peak: the simulator's peak (bytes); peak_event: the first event at the peak (-1: when the step starts).
        largest: the largest storages alive at the peak: dicts ``bytes``, ``kind``, ``made_by``, ``phase``.
    """

    start: Dict[str, int]
    kinds: List[int]
    deltas: List[int]
    makers: List[str]
    phases: List[Tuple[str, int]]
    peak: int
    peak_event: int
    largest: List[Dict[str, Any]] = field(default_factory=list)
    #: index of each event of the simulator's trace -> its position here (not in :meth:`as_dict`)
    positions: Dict[int, int] = field(default_factory=dict)

    def totals(self) -> List[int]:
        """Bytes held after each event (the sum of the kinds)."""
        live, out = sum(self.start.values()), []
        for delta in self.deltas:
            live += delta
            out.append(live)
        return out

    def stacks(self) -> Dict[str, List[int]]:
        """Bytes held by each kind after each event."""
        level = [self.start.get(k, 0) for k in KINDS]
        out: Dict[str, List[int]] = {k: [] for k in KINDS}
        for kind, delta in zip(self.kinds, self.deltas):
            level[kind] += delta
            for k, name in enumerate(KINDS):
                out[name].append(level[k])
        return out

    def at_peak(self) -> Dict[str, int]:
        """Bytes by kind at the peak."""
        if self.peak_event < 0:
            return dict(self.start)
        return {k: v[self.peak_event] for k, v in self.stacks().items()}

    def as_dict(self) -> Dict[str, Any]:
        """JSON-ready: makers as indices into ``maker_names``."""
        names = sorted(set(self.makers))
        position = {n: i for i, n in enumerate(names)}
        return {"start": self.start, "kind": self.kinds, "delta": self.deltas, "maker_names": names,
                "maker": [position[m] for m in self.makers], "phases": [list(p) for p in self.phases],
                "peak": self.peak, "peak_event": self.peak_event, "at_peak": self.at_peak(),
                "largest": self.largest}


def program_timeline(simulator: Simulator, program: DeviceProgram) -> ProgramTimeline:
    """The timeline of ``program`` from ``simulator``: simulated under a :class:`Labeler` (the result cached: the
    one the simulator's peaks then give), its peak checked equal to the peak simulated before, if any, and to its
    own events' maximum.

    Learned kernel workspaces (``simulator.workspaces``) are drawn as ``temporaries`` held while their operator
    runs: an event that adds them and one that takes them off.

    Raises:
        RuntimeError: the labelled simulation's peak differs from the cached one (a bug).
    """
    cached = simulator._cache.get(simulator.representative(program))  # the reported simulation, if it ran
    labeler = Labeler(program)
    result = simulator.result(program, observer=labeler)
    if cached is not None and result.peak != cached.peak:
        raise RuntimeError(f"timeline: the labelled simulation of {program} peaks at {result.peak} bytes, the "
                           f"reported one at {cached.peak}")
    reported = result.peak
    start_bytes, events = result.trace
    start = {k: 0 for k in KINDS}
    for key, (_, size) in labeler.start.items():
        start[labeler.held_kind(key)] += size
    if sum(start.values()) != start_bytes:
        raise RuntimeError(f"timeline: {sum(start.values())} bytes held at the start, the simulator says "
                           f"{start_bytes}")
    timeline = _events(labeler, events, start, simulator.round_to, reported)
    if max([start_bytes] + timeline.totals()) != reported:
        raise RuntimeError(f"timeline: the events of {program} peak at {max([start_bytes] + timeline.totals())} "
                           f"bytes, the simulator at {reported}")
    return timeline


def _events(labeler: Labeler, events: List[tuple], start: Dict[str, int], round_to: int,
            peak: int) -> ProgramTimeline:
    kinds, deltas, makers, ids, sizes, positions = [], [], [], [], {}, {}
    resized = {e[1] for e in events if e[0] == "r"}  # storages resized in place: FSDP's all-gathered parameters
    spikes: Dict[int, List[Tuple[int, str]]] = {}
    for position, held, what in labeler.workspaces:
        spikes.setdefault(position, []).append((held, what))

    def add(kind: str, delta: int, made: str, ident: Any) -> None:
        kinds.append(KINDS.index(kind))
        deltas.append(delta)
        makers.append(made)
        ids.append(ident)

    for index in range(len(events) + 1):
        for k, (held, what) in enumerate(spikes.get(index, ())):  # held while the operator runs, then gone
            add("temporaries", held, what, ("w", index, k))
            add("temporaries", -held, what, ("w", index, k))
        if index == len(events):
            break
        event = events[index]
        positions[index] = len(deltas)
        if event[0] == "m":
            continue
        if event[0] == "d":  # a storage held before the step, resized or freed: what it was is not known
            add(labeler.held_kind(-1), event[1], "held before the step", ("d", index))
            continue
        alloc = index if event[0] == "a" else event[1]
        new = rounded(event[-1], round_to) if event[0] != "f" else 0
        add("communication" if alloc in resized else labeler.kind(alloc), new - sizes.get(alloc, 0),
            labeler.labels[alloc][1], alloc)
        sizes[alloc] = new
    phases = [(name, positions.get(first, len(deltas))) for name, first in labeler.phases]
    live, peak_event = sum(start.values()), -1
    for i, delta in enumerate(deltas):
        live += delta
        if live == peak and peak_event < 0 and live > sum(start.values()):
            peak_event = i
    timeline = ProgramTimeline(start, kinds, deltas, makers, phases, peak, peak_event, positions=positions)
    timeline.largest = _largest(labeler, timeline, ids)
    return timeline


def _largest(labeler: Labeler, timeline: ProgramTimeline, ids: List[Any]) -> List[Dict[str, Any]]:
    """The largest storages alive at the peak (held before the step: each kind's, summed)."""
    alive: Dict[Any, List[Any]] = {}
    for i in range(timeline.peak_event + 1):
        entry = alive.setdefault(ids[i], [0, KINDS[timeline.kinds[i]], timeline.makers[i]])
        entry[0] += timeline.deltas[i]
        if entry[0] == 0:
            del alive[ids[i]]
    rows = [{"bytes": size, "kind": kind, "made_by": made,
             "phase": labeler.labels[ident][0] if ident in labeler.labels else "workspace"}
            for ident, (size, kind, made) in alive.items() if size > 0]
    rows += [{"bytes": size, "kind": kind, "made_by": "held before the step", "phase": "before"}
             for kind, size in timeline.start.items() if size]
    return sorted(rows, key=lambda r: -r["bytes"])[:LARGEST]


def _label(program: DeviceProgram, devices: Sequence[int]) -> str:
    if len(devices) == 1:
        return f"device {devices[0]}" if program.strategy not in DISTRIBUTED else f"rank {devices[0]}"
    word = "ranks" if program.strategy in DISTRIBUTED else "devices"
    return f"{word} {devices[0]}-{devices[-1]}" if list(devices) == list(range(devices[0], devices[-1] + 1)) \
        else f"{word} {', '.join(map(str, devices))}"


def build_timeline(simulator: Simulator, strategies: Sequence[str], batch: int, num_devices: int,
                   config: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Every device's timeline of every strategy (devices with equal programs share one), as JSON-ready data:
    ``{"config", "kinds", "kind_names", "strategies": {name: {"split", "peak_bytes", "limiting_device",
    "programs": [{"devices", "label", **ProgramTimeline.as_dict()}]}}}``."""
    data = {"config": dict(config or {}), "kinds": list(KINDS), "kind_names": KIND_NAMES, "strategies": {}}
    data["config"].setdefault("devices", num_devices)
    data["config"].setdefault("batch_size", batch)
    for strategy in strategies:
        split = _strategy_split(simulator, strategy, batch, num_devices)  # balanced-auto's search simulates
        groups: Dict[DeviceProgram, List[int]] = {}
        for device, program in enumerate(device_programs(strategy, split)):
            groups.setdefault(simulator.representative(program), []).append(device)
        programs = []
        for key, devices in groups.items():
            program = device_programs(strategy, split)[devices[0]]
            if not program.share and not program.keeps_module:
                continue
            entry = {"devices": devices, "label": _label(program, devices)}
            entry.update(program_timeline(simulator, program).as_dict())  # first: the labelled run is the one
            programs.append(entry)
        peaks = simulator.peaks(strategy, split)  # the labelled simulations, cached
        limiting = max(range(num_devices), key=lambda d: (peaks[d], -d))
        data["strategies"][strategy] = {"split": list(split), "peak_bytes": list(peaks),
                                        "limiting_device": limiting, "programs": programs}
    return data


def timeline(step: Union[StepSpec, Simulator], *, batch: int, num_devices: int,
             strategies: Sequence[str] = ("gather", "balanced"), out_dir: Optional[str] = None,
             round_to: int = CUDA_BLOCK, config: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The memory of each device over one training step under each strategy (:func:`build_timeline`), written to
    ``out_dir`` when given (:func:`write_timeline`: ``timeline.json``, ``timeline.png``, ``timeline.html``).

    Args:
        step: a :class:`~encoding.memory.StepSpec` (simulated with ``round_to``), or the
            :class:`~encoding.memory.Simulator` whose peaks were reported (the same simulation).
        batch: total batch; num_devices: devices (ranks); strategies: from
            :data:`~encoding.memory.program.MEMORY_STRATEGIES`.
    """
    simulator = step if isinstance(step, Simulator) else Simulator(step, round_to)
    data = build_timeline(simulator, strategies, batch, num_devices, config)
    if out_dir is not None:
        write_timeline(data, out_dir)
    return data


def write_timeline(data: Dict[str, Any], out_dir: str) -> List[str]:
    """``timeline.json``, and with matplotlib ``timeline.png``, and ``timeline.html`` in ``out_dir`` (created),
    each written atomically; returns the paths written."""
    from .timeline_draw import timeline_html, write_png

    os.makedirs(out_dir, exist_ok=True)
    paths = [atomic_write(os.path.join(out_dir, "timeline.json"), json.dumps(data))]
    png = write_png(data, os.path.join(out_dir, "timeline.png"))
    paths += [png] if png else []
    paths.append(atomic_write(os.path.join(out_dir, "timeline.html"), timeline_html(data)))
    return paths


def check_options(args: argparse.Namespace) -> None:
    """``--timeline`` draws the report's simulation: refused with ``--devices`` (measured, not simulated) and
    ``--calibrate`` (learned again, the workspaces would differ from the report's), and where ``DIR`` is a file
    (:func:`encoding.memory.cli.check_outputs` checks that it can be written).

    Raises:
        UsageError: naming the option.
    """
    from ..errors import UsageError

    if args.devices is not None:
        raise UsageError("--timeline draws the simulated step; use it with --simulate N, not --devices")
    if args.calibrate:  # its real steps cannot be repeated exactly: the timeline would not be the report's step
        raise UsageError("--timeline with --calibrate: the calibration's real steps cannot be repeated exactly, so "
                         "the timeline would not be the report's simulation; drop one (in Python: "
                         "encoding.memory.timeline(Simulator(spec, workspaces=...), ...))")
    if os.path.exists(args.timeline) and not os.path.isdir(args.timeline):
        raise UsageError(f"--timeline: {args.timeline!r} is a file; give a folder")


def write_report_timeline(args: argparse.Namespace, report: Dict[str, Any]) -> List[str]:
    """``--timeline DIR``: the timeline of the tool's step (the same simulation: its peaks are checked equal to
    ``report``'s), written to ``DIR``."""
    from .report import step_arguments
    from .spec import step_spec

    simulator = Simulator(step_spec(**step_arguments(args)), CUDA_BLOCK, backend=args.backend)
    data = build_timeline(simulator, args.strategies, args.batch_size, args.num_devices, report["config"])
    for name, entry in data["strategies"].items():
        reported = report["strategies"][name]["peak_mib"]
        if [round(p / MIB, 2) for p in entry["peak_bytes"]] != reported:
            raise RuntimeError(f"timeline: {name} peaks {entry['peak_bytes']} differ from the report's {reported}")
    return write_timeline(data, args.timeline)


def timeline_png(out_dir: str) -> Optional[str]:
    """The PNG a ``--timeline out_dir`` run wrote (for the web page's Plan tab), or ``None``."""
    path = os.path.join(out_dir, "timeline.png")
    return path if os.path.isfile(path) else None
