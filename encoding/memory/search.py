"""The advice's searches (:mod:`encoding.memory.advice`, :func:`~encoding.memory.balance.max_batch`): the largest
value whose peak fits a limit, for a peak that is the larger of a fixed level and a line (:func:`largest_fitting`),
and that value confirmed at the boundary (:func:`confirm_boundary`)."""
from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

__all__ = ["largest_fitting", "confirm_boundary"]

#: Where the verification gives up stepping down (a line that far off is a bug, not a rounding).
_MAX_STEPS = 8


def largest_fitting(peak: Callable[[int], int], start: int, limit: int, step: int = 1,
                    axis: Callable[[int], float] = float,
                    reference: Optional[Callable[[int], int]] = None) -> int:
    """The largest ``v`` (a multiple of ``step``) with ``peak(v) <= limit`` (``0`` when even ``step`` does not fit),
    for a ``peak`` that is convex and piecewise affine in ``axis(v)``: the larger of a fixed level (e.g. the
    optimizer step's) and a line (the activations).

    The line's growth comes from two points of ``reference`` (default ``peak`` itself; a strategy whose devices
    grow alike, simulated once for all of them, whose fixed level may be another, even above ``limit``): ``start``
    and ``start + step``, doubling while it is flat (still the fixed level) and ``peak`` estimated from it fits. With one point of ``peak`` the line's crossing of ``limit`` is the candidate, and one simulation
    verifies it: it stands when its peak fits and lies on the line; otherwise the line is refitted through the
    newest points of ``peak`` (secant steps).
    """
    known: Dict[Tuple[int, int], int] = {}

    def cached(function: Callable[[int], int], which: int) -> Callable[[int], int]:
        def at(v: int) -> int:
            if (which, v) not in known:
                known[which, v] = function(v)
            return known[which, v]
        return at

    at = cached(peak, 0)
    ref = cached(reference, 1) if reference is not None else at

    def estimate(v: int) -> int:  # peak(v) from the reference's growth since start (its own level may differ)
        return at(start) + ref(v) - ref(start)

    a, b = start, start + step
    while ref(b) <= ref(a) and estimate(b) <= limit and b < 2 ** 32:
        a, b = b, 2 * b
    if a != start:  # past the fixed level: two points on the line
        a, b = b, b + step
    slope = (ref(b) - ref(a)) / (axis(b) - axis(a))
    for _ in range(_MAX_STEPS):
        if slope <= 0:
            break
        candidate = _on_grid(axis(b) + (limit - at(b)) / slope, axis, step)
        if candidate <= 0:
            return step if at(step) <= limit else 0
        predicted = at(b) + slope * (axis(candidate) - axis(b))
        if at(candidate) <= limit and abs(at(candidate) - predicted) <= 1e-3 * limit:
            return candidate
        if candidate == b:
            break
        a, b = sorted((b, candidate))
        slope = (at(b) - at(a)) / (axis(b) - axis(a))
    fitting = [v for (which, v), p in known.items() if which == 0 and p <= limit]
    return max(fitting) if fitting else 0


def confirm_boundary(peak: Callable[[int], int], value: int, limit: int, step: int = 1) -> int:
    """``value`` (a multiple of ``step``) moved to the boundary and confirmed by ``peak``: the result fits (or is
    ``0``: not even ``step`` fits) and one ``step`` more does not. A search whose line was exact costs two ``peak``
    calls; one that missed gallops (doubling its step) to a bracket and bisects it.
    """
    gap = step
    if value == 0 or peak(value) <= limit:
        low, high = value, value + step
        while peak(high) <= limit:
            low, gap = high, gap * 2
            high = low + gap
    else:
        low, high = value - step, value
        while low > 0 and peak(low) > limit:
            high, gap = low, gap * 2
            low = max(0, high - gap)
    while high - low > step:
        mid = max(low + step, (low + high) // 2 // step * step)
        low, high = (mid, high) if peak(mid) <= limit else (low, mid)
    return low


def _on_grid(target: float, axis: Callable[[int], float], step: int) -> int:
    """The largest multiple of ``step`` whose ``axis`` value is at most ``target`` (``axis`` increasing)."""
    if target < axis(step):
        return 0
    value = step
    while axis(value * 2) <= target:
        value *= 2
    high = value * 2
    while high - value > step:
        mid = (value + high) // 2 // step * step
        value, high = (mid, high) if axis(mid) <= target else (value, mid)
    return value
