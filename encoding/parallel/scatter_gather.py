"""Scatter a batch over devices with balanced, explicit split sizes; gather per-replica outputs back."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn.parallel._functions import Scatter as _CudaScatter

from .devices import DeviceLike, all_distinct_cuda, resolve_device, resolve_devices
from .sample_lists import AmbiguousList, is_sample_list_output, leaf_batch_size, resolve_sample_lists
from .structures import PerSample, device_of, iter_leaves, transpose_map, zip_map

__all__ = ["get_split_sizes", "batch_size_of", "scatter", "scatter_kwargs", "gather", "to_device"]


def get_split_sizes(batch_size: int, num_devices: int) -> List[int]:
    """Balanced split of ``batch_size`` samples over at most ``num_devices`` replicas.

    Unlike ``torch.chunk`` (5 on 4 devices -> 2, 2, 1), every replica that runs gets ``floor`` or ``ceil`` of the
    mean, larger ones first, and no replica gets an empty share: 7 on 3 -> ``[3, 2, 2]``; 5 on 4 -> ``[2, 1, 1, 1]``;
    2 on 4 -> ``[1, 1]`` (two replicas run). An empty batch runs on one replica.

    Args:
        batch_size: number of samples (>= 0).
        num_devices: number of available devices (>= 1).

    Returns:
        The split sizes, ``min(batch_size, num_devices)`` entries summing to ``batch_size``.
    """
    if num_devices < 1:
        raise ValueError(f"num_devices must be >= 1, got {num_devices}")
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    if batch_size == 0:
        return [0]
    parts = min(batch_size, num_devices)
    base, extra = divmod(batch_size, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def batch_size_of(obj: Any, dim: int = 0, name: str = "inputs") -> Optional[int]:
    """The common size along ``dim`` of every tensor (and length of every :class:`PerSample`) in ``obj``.

    0-dim tensors and plain values do not count (they are passed to every replica). A plain list with one entry per
    sample (a detector's images and target dicts) counts by its length (see :mod:`encoding.parallel.sample_lists`).

    Returns:
        The batch size, or ``None`` when ``obj`` holds nothing to split.

    Raises:
        ValueError: when the leaves would split differently, naming each offending path and its size, or a list
            reads both as samples and as batched tensors (the message names ``PerSample``).
    """
    return _batch_size(resolve_sample_lists(obj, dim, name), dim, name)


def _batch_size(obj: Any, dim: int, name: str) -> Optional[int]:
    """:func:`batch_size_of` of a structure whose lists of samples are resolved already."""
    sizes: Dict[str, int] = {}
    for path, leaf in iter_leaves(obj, name):
        size = leaf_batch_size(path, leaf, dim)
        if size is not None:
            sizes[path] = size
    if len(set(sizes.values())) > 1:
        listing = ", ".join(f"{p} has {s}" for p, s in sizes.items())
        raise ValueError(f"cannot scatter: tensors in one call would split differently along dim {dim} ({listing}); "
                         "every batched tensor (and PerSample list) must have the same size there; a list with one "
                         "entry per sample (images of different sizes, target dicts) goes in "
                         "encoding.parallel.PerSample")
    return next(iter(sizes.values()), None)


def _split_leaf(leaf: Any, devices: Sequence[torch.device], sizes: Sequence[int], dim: int) -> List[Any]:
    if isinstance(leaf, PerSample):
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        return [PerSample(to_device(item, d) for item in leaf[a:b])
                for a, b, d in zip(bounds[:-1], bounds[1:], devices)]
    if not isinstance(leaf, Tensor):
        return [leaf] * len(devices)
    if leaf.dim() == 0:
        return _moved([leaf] * len(devices), devices)
    if len(devices) == 1:
        return [leaf.to(devices[0])]
    if all_distinct_cuda(devices):
        return list(_CudaScatter.apply([d.index for d in devices], list(sizes), dim, leaf))
    return _moved(torch.split(leaf, list(sizes), dim), devices)


def _moved(tensors: Sequence[Tensor], devices: Sequence[torch.device]) -> List[Tensor]:
    """Each tensor on its device, at most one of them the input itself or a view of it: views share one autograd
    version counter, so (as torch's scatter) an in-place edit in one replica must not invalidate another's backward,
    nor be applied once per replica to one shared tensor."""
    parts: List[Tensor] = []
    aliased = False
    for tensor, d in zip(tensors, devices):
        part = tensor.to(d)
        if part is tensor:  # still the input (or a view of it): the first replica keeps it, the others a copy
            part, aliased = (tensor.clone() if aliased else tensor), True
        parts.append(part)
    return parts


def scatter(inputs: Any, devices: Sequence[DeviceLike], dim: int = 0,
            split_sizes: Optional[Sequence[int]] = None) -> List[Any]:
    """Split a nested structure of tensors into one structure per replica.

    Tensors are split along ``dim`` (differentiably) and moved to the replica's device; :class:`PerSample` lists are
    sliced alike; 0-dim tensors are copied to every device; other values (``None``, numbers, strings, plain lists)
    are passed to every replica unchanged. At most one replica's slice is a view of the input tensor (the others on
    its device are copies), so a module that edits its input in place works on repeated devices. A plain list of
    tensors or dicts with one entry per sample (a detector's images and targets) is scattered per sample, never cut
    along each image's first dimension, and a list that reads either way is refused
    (:mod:`encoding.parallel.sample_lists`) where the reading changes the split: with one target device nothing is
    split, and the inputs come back as they are, on that device (mmcv's ``scatter([a, b], [-1])``).

    Args:
        inputs: any nesting of tuples, lists, dicts, namedtuples and dataclasses.
        devices: the candidate devices (fewer replicas are used when the batch is smaller).
        dim: the batch dimension.
        split_sizes: explicit sizes (e.g. the ones a model used); default :func:`get_split_sizes`.

    Returns:
        A list with one structure per replica (``len(split_sizes)`` entries).

    Example:
        >>> parts = scatter((torch.zeros(7, 2), "tag"), ["cpu"] * 3)
        >>> [p[0].shape[0] for p in parts], parts[2][1]
        ([3, 2, 2], 'tag')
    """
    return _scatter_tree(inputs, devices, dim, split_sizes, "inputs")[0]


def _scatter_tree(tree: Any, devices: Sequence[DeviceLike], dim: int, split_sizes: Optional[Sequence[int]],
                  name: str) -> Tuple[List[Any], List[Optional[int]]]:
    devices = resolve_devices(devices)
    try:
        tree = resolve_sample_lists(tree, dim, name, None if split_sizes is None else sum(split_sizes))
    except AmbiguousList:
        if len(devices) != 1 or split_sizes is not None:
            raise
        # one replica: samples or batched tensors, it gets the whole list as it is; its size depends on the reading
        return [to_device(tree, devices[0])], [None]
    sizes = _check_sizes(_batch_size(tree, dim, name), devices, split_sizes)
    parts = transpose_map(lambda leaf: _split_leaf(leaf, devices[:len(sizes)], sizes, dim), tree, len(sizes))
    return parts, sizes


def _check_sizes(batch: Optional[int], devices: Sequence[torch.device],
                 split_sizes: Optional[Sequence[int]]) -> List[int]:
    if not devices:
        raise ValueError("scatter needs at least one device")
    if split_sizes is None:
        return [batch] if batch is None else get_split_sizes(batch, len(devices))
    sizes = list(split_sizes)
    if len(sizes) > len(devices):
        raise ValueError(f"split_sizes {sizes} needs {len(sizes)} devices but only {len(devices)} were given")
    if batch is not None and sum(sizes) != batch:
        raise ValueError(f"split_sizes {sizes} sum to {sum(sizes)} but the batch has {batch} samples")
    return sizes


def scatter_kwargs(inputs: Tuple[Any, ...], kwargs: Optional[Dict[str, Any]], devices: Sequence[DeviceLike],
                   dim: int = 0, split_sizes: Optional[Sequence[int]] = None
                   ) -> Tuple[List[Tuple[Any, ...]], List[Dict[str, Any]], List[Optional[int]]]:
    """Scatter positional and keyword arguments together, with one split for both.

    Returns:
        ``(inputs_per_replica, kwargs_per_replica, split_sizes)``. When nothing in the call can be split (a zero-arg
        module, or only plain values), one replica runs and the split size is ``[None]``.
    """
    parts, sizes = _scatter_tree((tuple(inputs), kwargs or {}), devices, dim, split_sizes, "args")
    return [p[0] for p in parts], [p[1] for p in parts], sizes


def to_device(tree: Any, device: DeviceLike) -> Any:
    """Move every tensor of a nested structure to ``device`` (nothing is split or checked).

    Example:
        >>> to_device({"x": torch.zeros(2), "tag": "a"}, "cpu")["tag"]
        'a'
    """
    device = resolve_device(device)
    return transpose_map(lambda leaf: [leaf.to(device) if isinstance(leaf, Tensor) else leaf], tree, 1)[0]


def _gather_leaf(values: List[Any], target: torch.device, dim: int) -> Any:
    first = values[0]
    if isinstance(first, PerSample):
        return PerSample(item for part in values for item in part)
    if isinstance(first, Tensor):
        if not all(isinstance(v, Tensor) for v in values):
            raise ValueError("cannot gather: some replicas returned a tensor and others did not at the same place")
        if len(values) == 1:
            return first.to(target)
        if first.dim() == 0:
            return torch.stack([v.to(target) for v in values])
        return torch.cat([v.to(target) for v in values], dim)
    if first is None and all(v is None for v in values):
        return None
    if all(v == first for v in values[1:]):
        return first
    return list(values)


def gather(outputs: Sequence[Any], target_device: Optional[DeviceLike] = None, dim: Optional[int] = None) -> Any:
    """Concatenate per-replica outputs into the whole-batch output on one device.

    Tensors are concatenated along ``dim`` (0-dim tensors are stacked into a vector, as torch does),
    :class:`PerSample` lists are concatenated, and so are per-sample plain lists of a
    :class:`~encoding.parallel.ReplicaOutputs` (each replica's list as long as its share: a detector's result dicts, see
    :func:`~encoding.parallel.sample_lists.is_sample_list_output`), in input order; equal plain values are returned
    once and differing ones as a list.

    Args:
        outputs: one (nested) output per replica, e.g. what :class:`DataParallelModel` returned.
        target_device: where the result lives (default: the device of the first replica's first tensor).
        dim: the batch dimension (default: the ``dim`` of a :class:`~encoding.parallel.ReplicaOutputs`, the one
            the model split along; 0 for a plain list).

    Returns:
        One structure shaped like each replica's output.

    Example:
        >>> gather([torch.ones(2, 3), torch.zeros(1, 3)], "cpu").shape
        torch.Size([3, 3])
    """
    if not isinstance(outputs, (list, tuple)) or not outputs:
        raise ValueError("gather expects a non-empty list with one output per replica")
    if target_device is None:
        target = device_of(outputs[0], torch.device("cpu"))
    else:
        target = resolve_device(target_device)
    if dim is None:
        dim = getattr(outputs, "dim", 0)
    sizes = getattr(outputs, "split_sizes", None)

    def sample_lists(values: List[Any]) -> Any:
        if sizes is None or not is_sample_list_output(values, sizes, dim, getattr(outputs, "sample_lists", False)):
            return NotImplemented
        return [to_device(item, target) for part in values for item in part]

    return zip_map(lambda values: _gather_leaf(values, target, dim), list(outputs), sample_lists)
