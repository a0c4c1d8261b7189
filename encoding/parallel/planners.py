"""Per-device split sizes of :class:`~encoding.parallel.DataParallelModel`: explicit ones (``chunk_sizes``, checked
by :func:`check_chunk_sizes`) or planned ones (``balance``), and the registry that names the planners.

``encoding.parallel`` imports nothing else of ``encoding`` (but the registry helper :mod:`encoding.registry`): a planner such as the memory planner
(:class:`encoding.memory.MemoryBalancer`, which simulates the wrapped module) lives in a higher layer and registers a
factory under its name when its package is imported (``import encoding`` imports ``encoding.memory``, which
registers ``"memory"``). ``DataParallelModel(..., balance="memory")`` then looks the name up here.
"""
from __future__ import annotations

from typing import Any, Callable, List, Protocol, Sequence

from torch import nn

from ..registry import Registry

__all__ = ["Balancer", "register_balancer", "registered_balancers", "make_balancer", "check_chunk_sizes"]


class Balancer(Protocol):
    """What ``DataParallelModel(balance=...)`` accepts: an object whose ``plan`` returns samples per device."""

    def plan(self, module: nn.Module, inputs: tuple, kwargs: dict, device_ids: Sequence[Any],
             dim: int = 0) -> List[int]:
        """Samples per device (one entry per device, zeros allowed) for this call of ``module``."""


_BALANCERS: Registry[Callable[[], Balancer]] = Registry("balancer")


def register_balancer(name: str, factory: Callable[[], Balancer]) -> None:
    """Make ``DataParallelModel(..., balance=name)`` use ``factory()`` (called with no argument) as its planner.

    Args:
        name: the string users pass as ``balance`` (e.g. ``"memory"``).
        factory: builds a planner with a :meth:`Balancer.plan` method (e.g. a planner class with defaults).
    """
    _BALANCERS[name] = factory


def registered_balancers() -> List[str]:
    """The names ``balance`` accepts now, in registration order."""
    return list(_BALANCERS)


def make_balancer(balance: Any) -> Any:
    """The planner for a ``balance`` argument: ``None``, a registered name, or an object with a ``plan`` method.

    Raises:
        ValueError: an unknown name (``"memory"`` before :mod:`encoding.memory` registered it), or an object
            without ``plan``.
    """
    if isinstance(balance, str) and balance in _BALANCERS:
        return _BALANCERS[balance]()
    if balance == "memory":
        raise ValueError("balance='memory' needs the memory planner, which registers itself when encoding.memory is "
                         "imported (import encoding, or import encoding.memory, before building the model)")
    if balance is not None and (isinstance(balance, str) or not callable(getattr(balance, "plan", None))):
        names = ", ".join(repr(n) for n in ["memory"] + [n for n in _BALANCERS if n != "memory"])
        raise ValueError(f"balance must be None, {names} or a MemoryBalancer, got {balance!r}")
    return balance


def check_chunk_sizes(sizes: Sequence[int], num_devices: int) -> List[int]:
    """Validate per-device split sizes: one non-negative integer per device, at least one positive.

    Raises:
        ValueError: naming the offending value.
    """
    sizes = list(sizes)
    if num_devices and len(sizes) != num_devices:
        raise ValueError(f"chunk_sizes {sizes} must have one entry per device ({num_devices} devices)")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in sizes):
        raise ValueError(f"chunk_sizes {sizes} must be non-negative integers")
    if not any(sizes):
        raise ValueError(f"chunk_sizes {sizes} gives no device a sample")
    return sizes
