"""One registry helper: a name -> object table of one kind, with one error for a name it does not hold (a leaf: it
imports nothing of ``encoding`` but the leaf :mod:`encoding.errors`).

It serves the segmentation models (:data:`encoding.models.ARCHITECTURES`), the datasets
(:data:`encoding.datasets.datasets`), the losses (:data:`encoding.nn.LOSSES`), the sharded strategies
(:data:`encoding.engine.builders.STRATEGIES`) and the split planners of ``DataParallelModel(balance=...)``.

Example:
    >>> losses = Registry("loss")
    >>> @losses.register("l1")
    ... def l1(a, b): return (a - b).abs().mean()
    >>> losses.names()
    ['l1']
    >>> losses.get("l2")
    Traceback (most recent call last):
    ...
    encoding.errors.UsageError: unknown loss 'l2'; valid: l1
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Mapping, Tuple, TypeVar, Union

from .errors import UsageError

__all__ = ["Registry"]

T = TypeVar("T")
_MISSING: Any = object()


class Registry(Dict[str, T]):
    """A ``dict`` of name -> object of one ``kind`` (``"dataset"``, ``"loss"``, ...), in registration order.

    Args:
        kind: what the objects are, for the messages (``"unknown <kind> 'x'; valid: a, b"``).
        entries: initial ``name -> object`` entries.
    """

    def __init__(self, kind: str, entries: Union[Mapping[str, T], Iterable[Tuple[str, T]]] = ()) -> None:
        super().__init__(entries)
        self.kind = kind

    def register(self, name: str, obj: Any = _MISSING) -> Any:
        """Add ``obj`` under ``name``; without ``obj``, a decorator that registers what it decorates.

        Returns:
            ``obj`` (or the decorator).

        Raises:
            UsageError: ``name`` is already registered (a ``ValueError``; exit status 2 in the scripts).
        """
        if obj is _MISSING:
            def decorator(target: Callable) -> Callable:
                self.register(name, target)
                return target
            return decorator
        if name in self:
            raise UsageError(f"{self.kind} {name!r} is already registered")
        self[name] = obj
        return obj

    def get(self, name: str, default: Any = _MISSING) -> Any:  # type: ignore[override]
        """The object registered as ``name``; ``default`` when given and ``name`` is unknown.

        Raises:
            UsageError: ``name`` is unknown and no ``default`` is given (:meth:`unknown`'s message; a
                ``ValueError``, exit status 2 in the scripts).
        """
        if name in self:
            return self[name]
        if default is not _MISSING:
            return default
        raise UsageError(self.unknown(name))

    def names(self) -> List[str]:
        """The registered names, in registration order."""
        return list(self)

    def unknown(self, name: Any) -> str:
        """The one message for a name this registry does not hold: ``unknown <kind> 'x'; valid: a, b, ...``."""
        return f"unknown {self.kind} {name!r}; valid: {', '.join(self) or 'none registered'}"
