"""Renamed keywords: the one place an old keyword argument is still accepted, with a ``FutureWarning`` naming the new
one (old module-level names go through :mod:`encoding.legacy.declare`)."""
from __future__ import annotations

import warnings
from typing import Any, Dict

__all__ = ["renamed_keyword"]


def renamed_keyword(old: Dict[str, Any], name: str, new: str, value: Any, where: str) -> Any:
    """``value``, or the old keyword ``name`` in ``old`` (with a ``FutureWarning`` naming ``new``).

    Args:
        old: the call's other keyword arguments (``**old``).
        name, new: the old and the new keyword.
        value: the new keyword's value.
        where: the function's name, for the messages.

    Raises:
        TypeError: another unexpected keyword in ``old`` (as Python's own message).
    """
    unknown = sorted(set(old) - {name})
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
    if name in old:
        warnings.warn(f"{where}({name}=...) is now {where}({new}=...)", FutureWarning, stacklevel=3)
        return old[name]
    return value
