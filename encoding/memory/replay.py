"""A device program's measured step replayed at any batch share and crop, without running it again: the advice's
fast path (:mod:`encoding.memory.advice`).

At a fixed model, strategy and policy, the step performs the same operators in the same order at every share and
crop; only the sizes of the storages it allocates change, each a product of the share, the crop's side and
constants. :func:`fit` takes the step's allocation events (:meth:`AllocationTracker.record
<encoding.memory.tracker.AllocationTracker.record>`) simulated at two points ``(share, crop)`` and
``(share + 1, crop + 8)``, checks that they are the same events in the same order, and writes every size as one
monomial ``m * share**i * crop**j`` through both points (the two points tell the exponents apart: ``3/2`` and
``(crop + 8) / crop`` share no factor). :meth:`Replay.peak` then runs the tracker's arithmetic (the allocator's
rounding, frees, in-place resizes) on the sizes at any point: the peak the simulator would give there, in
microseconds instead of a second. Where the two traces differ in any other way, or a size is no such monomial (a
feature map of ``ceil(crop / 32)`` at a crop not a multiple of 32), or a size at the asked point is not a whole
number, there is no replay (:func:`fit` returns ``None``, :meth:`Replay.peak` raises ``ValueError``) and the caller
simulates.

:func:`compose` reuses one strategy's forward and backward for another whose step runs the same forward and
backward around other state (``balanced`` and ``zero1`` around ``ddp``'s): checked event for event at one point.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .tracker import rounded

__all__ = ["Replay", "fit", "compose", "size_table", "refit", "head", "rest_is_constant"]

#: Exponents of the share and of the crop's side a storage's size may have (an image is ``share * crop**2``, a
#: gathered output ``num_devices * share * ...``).
_POWERS = [(i, j) for i in range(3) for j in range(5)]

Trace = Tuple[int, List[tuple]]
Point = Tuple[int, int]


class Replay:
    """A step's allocation events with their sizes as monomials of ``(share, crop)``.

    Args:
        start: bytes live when the step starts (the same at every point).
        events: :meth:`~encoding.memory.tracker.AllocationTracker.record`'s events with each ``nbytes`` a
            monomial ``(m, i, j)``: ``m * share**i * crop**j`` bytes.
        round_to: the allocator's granularity.
    """

    def __init__(self, start: int, events: List[tuple], round_to: int) -> None:
        self.start, self.events, self.round_to = start, events, max(1, round_to)
        self._peaks: Dict[Point, int] = {}
        self._monomials = {e[-1] for e in events if e[0] in "ar"}  # the distinct sizes, evaluated once per point

    def peak(self, share: int, crop: int) -> int:
        """The step's peak bytes at ``share`` samples and ``crop``.

        Raises:
            ValueError: a size is not a whole number of bytes there (the fit does not hold at that point).
        """
        if (share, crop) not in self._peaks:
            self._peaks[share, crop] = self._run(share, crop)
        return self._peaks[share, crop]

    def _run(self, share: int, crop: int) -> int:
        r = self.round_to
        size: Dict[Tuple[Fraction, int, int], int] = {}  # each distinct monomial's bytes there, rounded
        for mono in self._monomials:
            value = mono[0] * share ** mono[1] * crop ** mono[2]
            if value.denominator != 1 or value < 0:
                raise ValueError(f"replay: {value} bytes at share {share}, crop {crop}")
            size[mono] = rounded(int(value), r)
        live = peak = self.start
        sizes: Dict[int, int] = {}
        for index, event in enumerate(self.events):
            kind = event[0]
            if kind == "a":
                sizes[index] = size[event[1]]
                live += sizes[index]
            elif kind == "f":
                live -= sizes.pop(event[1])
            elif kind == "r":
                new = size[event[2]]
                live += new - sizes[event[1]]
                sizes[event[1]] = new
            elif kind == "d":
                live += event[1]
            if live > peak:
                peak = live
        return peak


def _monomial(n1: int, n2: int, p1: Point, p2: Point) -> Optional[Tuple[Fraction, int, int]]:
    """The one monomial ``m * share**i * crop**j`` through ``n1`` bytes at ``p1`` and ``n2`` at ``p2``, or ``None``
    (none, or several)."""
    if n1 == n2:
        return Fraction(n1), 0, 0
    found = [(i, j) for i, j in _POWERS if n1 * p2[0] ** i * p2[1] ** j == n2 * p1[0] ** i * p1[1] ** j]
    if len(found) != 1 or n1 <= 0:
        return None
    i, j = found[0]
    return Fraction(n1, p1[0] ** i * p1[1] ** j), i, j


def fit(first: Trace, second: Trace, p1: Point, p2: Point, round_to: int) -> Optional[Replay]:
    """The replay of a step traced (:func:`~encoding.memory.simulate.simulate_program` with ``record``) at ``p1``
    and at ``p2`` (``(share, crop)``, differing in both), or ``None`` when the traces are not the same events or
    a size is not a monomial through both points."""
    (start, events), (start2, events2) = first, second
    if start != start2 or len(events) != len(events2) or p1[0] == p2[0] or p1[1] == p2[1]:
        return None
    fitted = []
    for one, two in zip(events, events2):
        if one[0] != two[0] or (one[0] in "fr" and one[1] != two[1]) or (one[0] in "dm" and one != two):
            return None
        if one[0] in "ar":
            mono = _monomial(one[-1], two[-1], p1, p2)
            if mono is None:
                return None
            one = one[:-1] + (mono,)
        fitted.append(one)
    return Replay(start, fitted, round_to)


def size_table(replays: Iterable[Replay], point: Point) -> Dict[int, set]:
    """Each storage size of ``replays``' steps at ``point`` -> the monomials it is there."""
    table: Dict[int, set] = {}
    for replay in replays:
        scale = {power: point[0] ** power[0] * point[1] ** power[1] for power in _POWERS}
        for e in replay.events:
            if e[0] in "ar":
                table.setdefault(int(e[-1][0] * scale[e[-1][1:]]), set()).add(e[-1])
    return table


def refit(trace: Trace, table: Dict[int, set], round_to: int) -> Optional[Replay]:
    """The replay of a step traced at one point from the sizes other steps of the same model have there
    (:func:`size_table`: e.g. the same model under another checkpointing policy, which recomputes the same
    activations): every size must be one of them, and one monomial. ``None`` otherwise (then :func:`fit` it)."""
    start, events = trace
    fitted = []
    for e in events:
        if e[0] in "ar":
            known = table.get(e[-1], ())
            if len(known) != 1:
                return None
            e = e[:-1] + (next(iter(known)),)
        fitted.append(e)
    return Replay(start, fitted, round_to)


def compose(line: Replay, own: Trace, reference: Trace) -> Optional[Replay]:
    """A strategy's replay from ``line``'s forward and backward and its own state around them.

    ``own`` is the strategy's step and ``reference`` ``line``'s step, both traced at one point (under this policy,
    or another one of the same model: ``line``'s may recompute activations): their events up to the mark
    (forward and backward done) must be the same, ``line`` must start from what ``reference`` starts from (the
    same parameters, buffers and optimizer state), hold the same storages at the mark (the gradients), and its
    events after the mark must not change with the point (then neither do ``own``'s: the same gradients arrive,
    the same optimizer steps). ``None`` otherwise."""
    own_start, own_events = own
    end, line_end = _mark(own_events), _mark(line.events)
    if end is None or line_end is None or own_events[:end + 1] != reference[1][:end + 1]:
        return None
    if line.start != reference[0] or any(e[0] in "ar" and e[-1][1:] != (0, 0) for e in line.events[line_end:]):
        return None
    held, line_held = _held(own_events[:end]), _held(line.events[:line_end])
    if [own_events[i][1] for i in held] != [line.events[i][1][0] for i in line_held] or \
            any(line.events[i][1][1:] != (0, 0) for i in line_held):
        return None
    moved = dict(zip(held, line_held))

    def index(i: int) -> int:  # an allocation of own's step in the composed one
        return moved[i] if i < end else i - end + line_end

    rest = []
    for e in own_events[end + 1:]:
        if e[0] in "fr":
            e = (e[0], index(e[1])) + e[2:]
        rest.append(e[:-1] + ((Fraction(e[-1]), 0, 0),) if e[0] in "ar" else e)
    return Replay(own_start, line.events[:line_end + 1] + rest, line.round_to)


def _held(events: Sequence[tuple]) -> List[int]:
    """The allocation events whose storages are still live after ``events``, in order."""
    live: Dict[int, None] = {}
    for i, e in enumerate(events):
        if e[0] == "a":
            live[i] = None
        elif e[0] == "f":
            live.pop(e[1], None)
    return list(live)


def head(trace: Trace) -> Optional[Trace]:
    """``trace``'s events up to and with its mark (the step's forward and backward), or ``None`` without exactly
    one mark. :func:`fit` of two heads and :func:`compose` with a whole step give that step's replay from its
    forward and backward traced at the second point alone."""
    end = _mark(trace[1])
    return None if end is None else (trace[0], trace[1][:end + 1])


def rest_is_constant(replay: Replay) -> bool:
    """Whether every storage live at ``replay``'s mark (its forward and backward done) has a size that does not
    change with the point: then the rest of its step can stand for another step's with the same parameters
    (:func:`compose`)."""
    end = _mark(replay.events)
    return end is not None and all(replay.events[i][1][1:] == (0, 0) for i in _held(replay.events[:end]))


def _mark(events: Sequence[tuple]) -> Optional[int]:
    marks = [i for i, e in enumerate(events) if e[0] == "m"]
    return marks[0] if len(marks) == 1 else None
