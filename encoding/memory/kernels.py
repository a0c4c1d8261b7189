"""What CPU kernels hold beyond the tensors they return, probed for real while the simulator runs.

Fake tensors run no kernel, so the buffers a kernel allocates for itself are invisible to
:class:`~encoding.memory.tracker.AllocationTracker`. On the CPU the large ones are oneDNN's convolution buffers:
a dilated convolution whose taps reach past the input (DeepLabV3's ASPP rates 12/24/36 on a 14x14 map) computes its
weight gradient through im2col, holding one sample's columns and weight-sized accumulators per thread (42 MB for
torchvision's ASPP 960->256 3x3 at 14x14, for any batch), and reorders weights in the forward. :class:`CpuKernels`
runs each distinct convolution call once for real, on zeros of its share of samples (at most ``T + 1``, ``T`` the
intra-op thread count), records under ``torch.profiler`` the bytes it held beyond its outputs, and the tracker adds
them while the call runs on fake tensors. The probes allocate real memory, one operator of at most ``T + 1``
samples at a time.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, Optional, Sequence

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

from .profiler import _memory_levels, trace_events
from .tracker import Workspaces, batch_key

__all__ = ["PROBED_OPERATORS", "CpuKernels"]

#: The operators whose CPU kernels are probed (the convolutions: oneDNN's im2col columns, weight reorders and
#: per-thread weight-gradient accumulators).
PROBED_OPERATORS = ("aten::convolution", "aten::convolution_backward")
#: How many leading arguments of each probed operator carry the batch (the input, and backward's output gradient):
#: the others (the weight, whose first dimension may equal the share) keep their shapes in a probe.
_BATCH_ARGUMENTS = {"aten::convolution": 1, "aten::convolution_backward": 2}


class CpuKernels(Workspaces):
    """Workspaces of CPU kernels, probed the first time the simulator meets a call (see the module's docstring).

    A call on ``s`` samples holds its outputs (counted on the fake tensors at ``s``) and what the real kernel held
    beyond its outputs on ``min(s, T + 1)`` samples: the kernels' own buffers are per thread, so they stop growing
    once every thread has a sample, and a kernel may pick another algorithm for one sample than for two.

    Args:
        learned: workspaces learned from real steps (``--calibrate``), kept for the operators that are not probed
            (a learned convolution is interpolated between the shares of whole steps, 1 and 2 samples on one thread,
            where oneDNN may change algorithm: the probe at the call's own share replaces it).
        threads: the intra-op threads of the run planned for (default: ``torch.get_num_threads()``).
    """

    def __init__(self, learned: Optional[Workspaces] = None, threads: Optional[int] = None) -> None:
        super().__init__({key: dict(known) for key, known in (learned.table if learned else {}).items()
                          if "aten::" + key[0] not in PROBED_OPERATORS})
        self.threads = threads or torch.get_num_threads()
        self._extra: Dict[tuple, int] = {}

    def see(self, func: Any, args: tuple, kwargs: Optional[dict], shapes: Sequence[Sequence[int]],
            share: int) -> None:
        """Probe ``func`` on ``args`` (fake tensors whose leading ``share`` is the batch) if it is one of
        :data:`PROBED_OPERATORS` and this call was not measured yet."""
        name = func.name()
        if name not in PROBED_OPERATORS:
            return
        key = batch_key(name, shapes, share)
        if share in self.table.get(key, {}):
            return
        samples = min(share, self.threads + 1)
        if torch._C._autograd._profiler_enabled():  # a profiler cannot nest: the caller's own session is running
            if not self._extra:
                warnings.warn("encoding.memory: a torch.profiler session is running, so the CPU kernels' buffers "
                              "are not probed (the plan may miss oneDNN's convolution buffers)", stacklevel=2)
            self._extra[key, samples] = 0
        if (key, samples) not in self._extra:
            self._extra[key, samples] = _beyond_outputs(func, args, kwargs or {}, share, samples)
        outputs = _nbytes(func(*args, **(kwargs or {})))  # on the fake tensors: their sizes only
        self.table.setdefault(key, {})[share] = outputs + self._extra[key, samples]


def _nbytes(out: Any) -> int:
    """Bytes of the distinct storages of the tensors in ``out``."""
    storages = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tree_flatten(out)[0]
                if isinstance(t, Tensor)}
    return sum(storages.values())


def _real(value: Any, share: int, samples: int) -> Any:
    """A real tensor of zeros like the fake ``value`` with its leading ``share`` (the batch) made ``samples`` (a
    tensor that carries no batch: ``samples == share``)."""
    if not isinstance(value, Tensor):
        return value
    shape = list(value.shape)
    if value.dim() >= 2 and shape[0] == share:
        shape[0] = samples
    layout = (torch.channels_last if value.dim() == 4 and not value.is_contiguous()
              and value.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format)
    return torch.zeros(shape, dtype=value.dtype).contiguous(memory_format=layout)


def _beyond_outputs(func: Any, args: tuple, kwargs: dict, share: int, samples: int) -> int:
    """The most bytes ``func`` held at once beyond its outputs, run for real on zeros of ``samples`` samples."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        batched = _BATCH_ARGUMENTS[func.name()]
        real_args = tuple(tree_map(lambda v: _real(v, share, samples if i < batched else share), value)
                          for i, value in enumerate(args))
        real_kwargs = tree_map(lambda v: _real(v, share, share), kwargs)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
            outputs = _nbytes(func(*real_args, **real_kwargs))
        events = trace_events(prof)
    levels = _memory_levels(events, torch.device("cpu"))  # from the level before the probe's first event
    return max(0, max((level for _, level in levels), default=0) - outputs)
