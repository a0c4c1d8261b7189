"""Nested input/output structures: tuples, lists, dicts, namedtuples and dataclasses, plus the :class:`PerSample` marker."""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import torch

__all__ = ["PerSample", "iter_leaves", "transpose_map", "zip_map", "device_of"]


class PerSample(list):
    """A per-sample Python list that is split along with the batch.

    Plain Python values are passed unchanged to every replica. Wrap a list that holds one entry per sample (file
    names, image sizes, metadata dicts) in ``PerSample`` and :func:`~encoding.parallel.scatter` gives every replica
    the slice that matches its part of the batch; :func:`~encoding.parallel.gather` concatenates such slices back.
    Replicas receive ``PerSample`` objects, so a module can return them and they stay per-sample.

    Example:
        >>> names = PerSample(["a.jpg", "b.jpg", "c.jpg"])
        >>> len(names), isinstance(names, list)
        (3, True)
    """

    def __repr__(self) -> str:
        return f"PerSample({list.__repr__(self)})"


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _is_dataclass_instance(obj: Any) -> bool:
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def _children(obj: Any) -> List[Tuple[Any, Any]]:
    """``(key, child)`` pairs of a container, or ``[]`` for a leaf (tensors, PerSample and plain values)."""
    if isinstance(obj, (torch.Tensor, PerSample, str, bytes)):
        return []
    if isinstance(obj, (tuple, list)):
        return list(enumerate(obj))
    if isinstance(obj, dict):
        return list(obj.items())
    if _is_dataclass_instance(obj):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return []


def _is_container(obj: Any) -> bool:
    if isinstance(obj, (torch.Tensor, PerSample, str, bytes)):
        return False
    return isinstance(obj, (tuple, list, dict)) or _is_dataclass_instance(obj)


def _rebuild(template: Any, values: Sequence[Any]) -> Any:
    """A container of ``template``'s type holding ``values`` (in ``_children`` order)."""
    if _is_namedtuple(template):
        return type(template)(*values)
    if isinstance(template, tuple):
        return tuple(values)
    if isinstance(template, list):
        return type(template)(values) if type(template) is not list else list(values)
    if isinstance(template, dict):
        out = copy.copy(template)
        out.clear()
        out.update(zip(template.keys(), values))
        return out
    out = copy.copy(template)  # dataclass: keep fields with init=False and frozen dataclasses working
    for field, value in zip(dataclasses.fields(template), values):
        object.__setattr__(out, field.name, value)
    return out


def _join(path: str, key: Any) -> str:
    return f"{path}[{key!r}]" if isinstance(key, (int, str)) and not isinstance(key, bool) else f"{path}.{key}"


def iter_leaves(obj: Any, path: str = "") -> Iterator[Tuple[str, Any]]:
    """Yield ``(path, leaf)`` for every leaf of a nested structure, depth first, in order.

    Args:
        obj: a tensor, a :class:`PerSample`, a plain value or a (nested) container.
        path: the name used as prefix in the returned paths (for error messages).
    """
    if not _is_container(obj):
        yield path, obj
        return
    for key, child in _children(obj):
        yield from iter_leaves(child, _join(path, key))


def device_of(obj: Any, default: Optional[torch.device] = None) -> Optional[torch.device]:
    """The device of the first tensor in a nested structure, or ``default`` when it holds none."""
    tensor = next((leaf for _, leaf in iter_leaves(obj) if isinstance(leaf, torch.Tensor)), None)
    return tensor.device if tensor is not None else default


def transpose_map(fn: Callable[[Any], List[Any]], obj: Any, num: int) -> List[Any]:
    """Apply ``fn`` to every leaf (it returns ``num`` values) and return ``num`` structures shaped like ``obj``.

    This is the core of scatter: one nested structure in, one nested structure per replica out.
    """
    if not _is_container(obj):
        values = fn(obj)
        if len(values) != num:
            raise RuntimeError(f"internal error: leaf function returned {len(values)} values, expected {num}")
        return list(values)
    per_child = [transpose_map(fn, child, num) for _, child in _children(obj)]
    return [_rebuild(obj, [column[i] for column in per_child]) for i in range(num)]


def zip_map(fn: Callable[[List[Any]], Any], objs: Sequence[Any],
            whole: Optional[Callable[[List[Any]], Any]] = None) -> Any:
    """Inverse of :func:`transpose_map`: combine ``len(objs)`` same-shaped structures leaf by leaf with ``fn``.

    Args:
        fn: combines the values of one leaf.
        objs: the structures.
        whole: called first at every place with its values; a result other than ``NotImplemented`` is taken as
            the combined value there (its children are not visited), e.g. per-sample lists joined whole.

    Raises:
        ValueError: when the structures differ in type, length or keys.
    """
    if whole is not None:
        result = whole(list(objs))
        if result is not NotImplemented:
            return result
    first = objs[0]
    if not _is_container(first):
        return fn(list(objs))
    kinds = {type(o) for o in objs}
    if len(kinds) != 1:
        raise ValueError(f"cannot gather outputs of different types: {sorted(k.__name__ for k in kinds)}")
    children = [_children(o) for o in objs]
    keys = [[k for k, _ in c] for c in children]
    if any(k != keys[0] for k in keys):
        raise ValueError(f"cannot gather outputs with different structure: keys {keys}")
    columns = [[c[i][1] for c in children] for i in range(len(keys[0]))]
    return _rebuild(first, [zip_map(fn, column, whole) for column in columns])
