"""Allocation tracking on fake tensors: the bytes of live storages an operator creates, and their peak.

:class:`AllocationTracker` is the dispatch mode the simulator (:mod:`encoding.memory.simulate`) runs a device
program under; :class:`Workspaces` holds what kernels hold beyond the tensors they return (learned from real steps by
:func:`~encoding.memory.profiler.learn_workspaces`), which the tracker adds to its peak while such an operator runs.
"""
from __future__ import annotations

import bisect
import functools
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..parallel.structures import iter_leaves

__all__ = ["MIB", "CUDA_BLOCK", "AllocationTracker", "Workspaces", "batch_key", "rounded"]

MIB = 2 ** 20
#: Allocation granularity of the CUDA caching allocator (blocks are multiples of 512 bytes).
CUDA_BLOCK = 512


def rounded(nbytes: int, granularity: int) -> int:
    """``nbytes`` rounded up to a multiple of ``granularity`` (the allocator's block: 512 for CUDA, 1 for the CPU)."""
    return -(-nbytes // granularity) * granularity


class AllocationTracker(TorchDispatchMode):
    """Count the bytes of live tensor storages created by operators, and their peak.

    Every operator output whose storage was not seen before adds its ``nbytes`` (rounded up to ``round_to``, e.g.
    512 like the CUDA caching allocator's blocks); a weak reference subtracts it when the storage is freed. Views and
    in-place results share a seen storage and add nothing. A storage resized in place by ``UntypedStorage.resize_``
    (no operator sees it: FSDP2 frees and re-allocates its unsharded parameters so) counts at its new size while the
    tracker is active. On fake tensors a host read (``.item()``, ``.tolist()``) has no value: it returns ``False``
    for a boolean tensor, ``1`` for an integer one (BatchNorm's ``num_batches_tracked``, by which a ``momentum=None``
    BatchNorm divides) and ``0.5`` for a floating one (Adam's ``step``: its bias correction ``1 - beta1 ** step``
    divides; a random draw in ``[0, n)`` turned into an index, as torchvision's detection transforms pick a size, is
    index 0), so code that checks values (e.g. a target range check) passes and none divides by zero.

    Args:
        round_to: allocation granularity in bytes.
        workspaces: per-operator workspaces learned from a real run (:class:`Workspaces`); while such an operator
            runs, ``live`` is raised by what it held beyond its inputs.
        shares: the batch sizes the simulated program's operators see (its share, and the whole batch where it
            computes a gathered loss), to look ``workspaces`` up.

    Attributes:
        live: bytes currently allocated.
        peak: the largest ``live`` since the last :meth:`reset_peak`.
    """

    def __init__(self, round_to: int = 1, workspaces: Optional["Workspaces"] = None,
                 shares: Sequence[int] = (1,)) -> None:
        super().__init__()
        self.round_to = max(1, int(round_to))
        self.workspaces = workspaces
        self.shares = tuple(shares)
        self.live = 0
        self.peak = 0
        self._sizes: Dict[int, int] = {}
        self._refs: Dict[int, weakref.ref] = {}
        #: while recording (:meth:`record`), what changed ``live``, in order (see :mod:`encoding.memory.replay`)
        self.events: Optional[List[tuple]] = None
        self._allocated: Dict[int, int] = {}  # storage key -> index of its allocation event while recording
        #: told of the recording's start and mark, of every new storage and of every learned workspace
        #: (:class:`encoding.memory.timeline_labels.Labeler`)
        self.observer: Optional[Any] = None

    def track(self, tensors: Any) -> None:
        """Count tensors created outside the tracker (e.g. a module's fake parameters)."""
        for _, leaf in iter_leaves(tensors):
            if isinstance(leaf, Tensor):
                self._add(leaf)

    def live_storages(self) -> Dict[int, Tuple[Any, int]]:
        """The storages counted now: key -> (storage, bytes counted)."""
        return {key: (ref(), self._sizes[key]) for key, ref in list(self._refs.items()) if ref() is not None}

    def reset_peak(self) -> None:
        """Start a new peak window at the current live bytes."""
        self.peak = self.live

    def record(self) -> None:
        """Start recording the events that change ``live`` (:attr:`events`): ``("a", nbytes)`` a new storage of
        ``nbytes`` (not rounded), ``("f", i)`` the storage of allocation event ``i`` freed, ``("r", i, nbytes)`` it
        resized, ``("d", bytes)`` a storage that existed before the recording resized or freed (rounded),
        ``("m",)`` a mark (:meth:`mark_event`)."""
        self.events, self._allocated = [], {}
        if self.observer is not None:
            self.observer.started(self)

    def mark_event(self) -> None:
        """A ``("m",)`` event while recording (e.g. forward and backward done)."""
        if self.events is not None:
            self.events.append(("m",))
            if self.observer is not None:
                self.observer.marked(self)

    def _add(self, tensor: Tensor) -> None:
        if hasattr(tensor, "__tensor_flatten__"):  # a wrapper subclass (DTensor): count its inner tensors
            for name in tensor.__tensor_flatten__()[0]:
                inner = getattr(tensor, name)
                if isinstance(inner, Tensor):
                    self._add(inner)
            return
        self._add_storage(tensor.untyped_storage())

    def _add_storage(self, storage: Any) -> None:
        key = id(storage)
        size = rounded(storage.nbytes(), self.round_to)
        known = self._sizes.get(key)
        if known is not None and self._refs[key]() is storage:
            if known != size:  # resized in place
                self.live += size - known
                self._sizes[key] = size
                if self.events is not None:
                    index = self._allocated.get(key)
                    self.events.append(("d", size - known) if index is None else ("r", index, storage.nbytes()))
        else:
            self._sizes[key] = size
            self._refs[key] = weakref.ref(storage, functools.partial(self._free, key))
            self.live += size
            if self.events is not None:
                self._allocated[key] = len(self.events)
                self.events.append(("a", storage.nbytes()))
                if self.observer is not None:
                    self.observer.allocated(self, key, storage)
        self.peak = max(self.peak, self.live)

    def __enter__(self) -> "AllocationTracker":
        resize = torch.UntypedStorage.resize_
        tracker = self

        def tracked_resize(storage: Any, size: int) -> Any:
            result = resize(storage, size)
            tracker._add_storage(storage)  # counted at its new size (0: freed)
            return result

        self._resize = resize
        torch.UntypedStorage.resize_ = tracked_resize
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def _free(self, key: int, ref: weakref.ref) -> None:
        if self._refs.get(key) is ref:
            size = self._sizes.pop(key)
            self.live -= size
            del self._refs[key]
            if self.events is not None:
                index = self._allocated.pop(key, None)
                self.events.append(("d", -size) if index is None else ("f", index))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:  # a tensor's device: nothing allocated
            device = _fake_device(args[0])
            if device is not None:
                return device
        if func is torch.ops.aten._local_scalar_dense.default:  # no value: False, 1 or 0.5 (see the docstring)
            dtype = args[0].dtype
            return False if dtype == torch.bool else 0.5 if dtype.is_floating_point or dtype.is_complex else 1
        if self.workspaces is not None:
            shapes = _shapes(args, kwargs)
            self.workspaces.see(func, args, kwargs, shapes, self.shares[0])
            held = self.workspaces.bytes(func.name(), shapes, *self.shares)
            self.peak = max(self.peak, self.live + held)
            if held and self.observer is not None:
                self.observer.workspace(self, func.name(), held)
        out = func(*args, **(kwargs or {}))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, Tensor):
                self._add(leaf)
        return out


_DEVICE = torch.ops.prim.device.default


def _fake_device(tensor: Any) -> Optional[torch.device]:
    """What ``FakeTensor`` answers to ``prim.device`` (``None`` for another tensor), without its mode's dispatch: the
    autograd engine and the ``_foreach`` operators ask every tensor's device, most of a simulated step's operator
    calls."""
    mode = getattr(tensor, "fake_mode", None)
    if mode is None or not hasattr(tensor, "fake_device"):
        return None
    return torch.device("meta") if mode.in_kernel_invocation else tensor.fake_device


def _shapes(args: Any, kwargs: Any) -> List[Tuple[int, ...]]:
    return [tuple(t.shape) for t in tree_flatten((args, kwargs))[0] if isinstance(t, Tensor) and t.dim()]


def batch_key(name: str, shapes: Sequence[Sequence[int]], share: int) -> tuple:
    """An operator call with the batch dimension (a leading ``share`` of a tensor of 2+ dims) made symbolic."""
    return (name.split("::")[-1].split(".")[0],
            tuple(("B",) + tuple(s[1:]) if len(s) >= 2 and s[0] == share else tuple(s) for s in shapes))


class Workspaces:
    """Bytes that operators hold beyond the tensors they return (kernels' internal buffers), learned from the
    ``torch.profiler`` memory events of real steps at a few batch shares.

    For every operator call of a profiled real step (:func:`~encoding.memory.profiler.learn_workspaces`), the bytes
    it held above its starting level (its outputs included) are recorded under ``(operator, input shapes with the
    batch dimension symbolic)`` and the share. The tracker raises its peak by that much while the same call runs on
    fake tensors. Between measured shares the bytes are interpolated linearly, beyond them the last segment is
    extrapolated (CPU kernels keep one buffer per thread, so growth flattens once the share reaches the thread
    count: measure at 1, the thread count and one more).
    """

    def __init__(self, table: Dict[tuple, Dict[int, int]]) -> None:
        self.table = table

    def see(self, func: Any, args: tuple, kwargs: Optional[dict], shapes: Sequence[Sequence[int]],
            share: int) -> None:
        """Called with each operator call before :meth:`bytes` (a subclass may measure it: see
        :class:`~encoding.memory.kernels.CpuKernels`); learned workspaces need nothing."""

    def bytes(self, name: str, shapes: Sequence[Sequence[int]], *shares: int) -> int:
        """Workspace (outputs included) of operator ``name`` on inputs ``shapes`` (0 if unknown); the batch
        dimension is the first of ``shares`` that makes a known call."""
        for share in shares:
            known = self.table.get(batch_key(name, shapes, share))
            if known:
                return self._at(known, share)
        return 0

    @staticmethod
    def _at(known: Dict[int, int], share: int) -> int:
        points = sorted(known.items())
        if len(points) == 1 or share <= points[0][0]:
            return points[0][1]
        i = min(max(bisect.bisect_left([p for p, _ in points], share), 1), len(points) - 1)
        (s1, b1), (s2, b2) = points[i - 1], points[i]
        return max(0, int(round(b1 + (b2 - b1) * (share - s1) / (s2 - s1))))

    def __len__(self) -> int:
        return len(self.table)
