"""Plain lists of tensors or dicts in a call: a list of samples (a detector's images and target dicts) or a list of
batched tensors (feature maps)? Decided here, before anything is split, so an image is never cut along its channels.

torch's scatter splits every tensor of a plain list along the batch dimension. For ``model(list_of_CHW_images,
list_of_target_dicts)`` (torchvision's detection convention) that cuts each image along its channels, silently when
every image has as many boxes as channels. The rule (docs/parallel.md, "Lists"):

* a list of dicts is a list of samples when its length is the call's batch size; when no batched tensor outside
  such lists fixes the batch size, a list of dicts fixes it and every list of the call is a list of samples
  (``model(images, targets)``): they are scattered like :class:`~encoding.parallel.PerSample` lists;
* a list of tensors is a list of samples when only that reading fits the call's batch size, a list of batched
  tensors (split along ``dim``) when only that one fits; when both fit, the call is refused, naming ``PerSample``
  (for samples) and a tuple (for batched tensors), which say it without ambiguity (:class:`AmbiguousList`;
  :func:`~encoding.parallel.scatter_gather.scatter` to one device needs no reading: it splits nothing).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Set, Tuple

from torch import Tensor

from ..errors import UsageError
from .structures import PerSample, _children, _is_container, _join, _rebuild, iter_leaves

__all__ = ["AmbiguousList", "leaf_batch_size", "resolve_sample_lists", "is_sample_list_output"]


class AmbiguousList(UsageError):
    """A plain list of tensors reads as samples and as batched tensors alike, and the split depends on the reading
    (the message names ``PerSample`` and a tuple, which say it without ambiguity)."""


def leaf_batch_size(path: str, leaf: Any, dim: int) -> Optional[int]:
    """The size a leaf is split by: a :class:`PerSample`'s length, a tensor's size along ``dim``, else ``None``."""
    if isinstance(leaf, PerSample):
        return len(leaf)
    if isinstance(leaf, Tensor) and leaf.dim() > 0:
        if leaf.dim() <= dim:
            raise ValueError(f"cannot scatter {path or 'input'} of shape {tuple(leaf.shape)} along dim {dim}")
        return leaf.size(dim)
    return None


def _kind(obj: Any) -> Optional[str]:
    """``"tensors"`` / ``"dicts"`` for a plain, non-empty list of batched tensors or of dicts holding tensors."""
    if type(obj) is not list or not obj:
        return None
    if all(isinstance(x, Tensor) and x.dim() > 0 for x in obj):
        return "tensors"
    if all(isinstance(x, dict) for x in obj) and any(isinstance(leaf, Tensor) for _, leaf in iter_leaves(obj)):
        return "dicts"
    return None


def _candidates(obj: Any, path: str, found: List[Tuple[str, list]]) -> None:
    if _kind(obj):
        found.append((path, obj))
    elif _is_container(obj):
        for key, child in _children(obj):
            _candidates(child, _join(path, key), found)


def _outside_sizes(obj: Any, path: str, dim: int, sizes: Set[int]) -> None:
    if _kind(obj):
        return
    if _is_container(obj):
        for key, child in _children(obj):
            _outside_sizes(child, _join(path, key), dim, sizes)
        return
    size = leaf_batch_size(path, obj, dim)
    if size is not None:
        sizes.add(size)


def _inner_sizes(path: str, items: list, dim: int) -> Set[int]:
    return {s for p, leaf in iter_leaves(items, path) for s in [leaf_batch_size(p, leaf, dim)] if s is not None}


def _decide(path: str, items: list, kind: str, batch: Optional[int], lengths: Set[int], all_inner: Set[int],
            dim: int, samples_call: bool) -> bool:
    """Whether ``items`` is a list of samples (``True``) or of batched values (``False``); raises when both fit,
    unless the call's batch size comes from a list of dicts (``samples_call``: the detection convention)."""
    inner = _inner_sizes(path, items, dim)
    if batch is None:  # only lists of tensors in the call
        per_sample, batched = len(lengths) == 1, len(all_inner) == 1
    else:
        per_sample, batched = len(items) == batch, inner == {batch}
    if per_sample and (kind == "dicts" or samples_call or not batched):
        return True
    if batched and not per_sample:
        return False
    if per_sample:
        size = next(iter(inner))
        raise AmbiguousList(
            f"cannot scatter {path}: a list of {len(items)} tensors of size {size} along dim {dim} may be "
            f"{len(items)} samples (e.g. a detector's images) or batched tensors of {size} samples each; wrap a list "
            f"with one entry per sample in encoding.parallel.PerSample(...) and pass batched tensors as a tuple")
    return False  # neither reading fits: the size check names every leaf


def resolve_sample_lists(tree: Any, dim: int = 0, name: str = "inputs", batch_size: Optional[int] = None) -> Any:
    """``tree`` with every plain list that holds one entry per sample wrapped in :class:`PerSample`.

    Args:
        tree: the call's arguments.
        dim: the batch dimension.
        name: the root's name in error messages.
        batch_size: the batch size when the caller knows it (e.g. the model's split sizes, for the criterion's
            targets); otherwise the call's batched tensors (or a list of dicts) decide it.

    Raises:
        AmbiguousList: a list of tensors reads as samples and as batched tensors alike (the message names
            ``PerSample``).
    """
    found: List[Tuple[str, list]] = []
    _candidates(tree, name, found)
    if not found:
        return tree
    outside: Set[int] = set()
    _outside_sizes(tree, name, dim, outside)
    if len(outside) > 1:
        return tree  # the size check reports the conflict
    dict_lists = [items for _, items in found if _kind(items) == "dicts"]
    samples_call = not outside and bool(dict_lists)
    batch = next(iter(outside), batch_size)
    if batch is None and samples_call:
        batch = len(dict_lists[0])
    lengths = {len(items) for _, items in found}
    all_inner = set().union(*(_inner_sizes(p, items, dim) for p, items in found))
    samples = {id(items) for path, items in found
               if _decide(path, items, _kind(items), batch, lengths, all_inner, dim, samples_call)}
    return _wrap(tree, samples) if samples else tree


def _wrap(obj: Any, samples: Set[int]) -> Any:
    if id(obj) in samples:
        return PerSample(obj)
    if not _is_container(obj) or _kind(obj) is not None:
        return obj
    return _rebuild(obj, [_wrap(child, samples) for _, child in _children(obj)])


def is_sample_list_output(values: Sequence[Any], split_sizes: Sequence[Optional[int]], dim: int = 0,
                          sample_inputs: bool = False) -> bool:
    """Whether the replicas' ``values`` at one place of their outputs are per-sample lists (a detector's list of
    result dicts in eval mode), to be gathered by concatenation in replica order: every value a plain list as long
    as its replica's share, of dicts, or of tensors that do not all read as batched along ``dim`` (the lists of
    batched tensors that ``torch``'s gather joins element by element, e.g. ``[out, aux]``).

    Raises:
        ValueError: lists of tensors that read both ways in a call whose inputs were lists of samples
            (``sample_inputs``), naming ``PerSample``.
    """
    if len(values) != len(split_sizes) or any(size is None for size in split_sizes):
        return False
    if not all(type(v) is list and len(v) == size for v, size in zip(values, split_sizes)):
        return False
    kinds = {_kind(v) for v in values}
    if kinds == {"dicts"}:
        return True
    if kinds != {"tensors"}:
        return False
    if not all(t.dim() > dim and t.size(dim) == size for v, size in zip(values, split_sizes) for t in v):
        return True
    if sample_inputs:
        raise ValueError(f"cannot gather: each replica returned a list as long as its share {list(split_sizes)} "
                         f"of tensors of that size along dim {dim}: samples or batched tensors? Return "
                         "encoding.parallel.PerSample(...) for one entry per sample, a tuple for batched tensors")
    return False
