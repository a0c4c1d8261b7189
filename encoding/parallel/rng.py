"""Per-replica random streams: reproducible randomness for replicas that share a device's generator.

Replicas on distinct CUDA devices draw from their own device's generator. Replicas on a *repeated* device (every
``"cpu"`` of ``["cpu"] * 3``, or ``["cuda:0"] * 2``) would share one generator and draw from it in whatever order
their threads happen to run, so two identical runs differ (dropout masks land on different replicas) and an
activation-checkpointed region recomputed later cannot see the masks of its forward. :func:`parallel_apply
<encoding.parallel.parallel_apply>` therefore gives each such replica its own generator, seeded from one number
drawn from the default generator (reproducible under ``torch.manual_seed``) and the replica index, and routes the
replica's random operators to it with :class:`ReplicaRandom`.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import threading
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import EncodingError

__all__ = ["ReplicaRandom", "draw_base_seed", "replica_seed", "replica_generator", "stream_restoring_checkpoint",
           "ForeignCheckpointRandomness"]

_MASK64 = (1 << 64) - 1


def draw_base_seed() -> int:
    """One 63-bit number from the default CPU generator (the seed all replicas of one call derive theirs from)."""
    return int(torch.empty((), dtype=torch.int64).random_(0, 1 << 62))


def replica_seed(base: int, index: int) -> int:
    """A well-mixed 63-bit seed for replica ``index`` from ``base`` (SplitMix64 finaliser of ``base + index``)."""
    z = (base + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


def replica_generator(device: torch.device, base: int, index: int) -> torch.Generator:
    """A generator on ``device`` seeded with :func:`replica_seed` ``(base, index)``."""
    return torch.Generator(device=device).manual_seed(replica_seed(base, index))


def _has_generator(func: Any) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and any(arg.name == "generator" for arg in schema.arguments)


@functools.lru_cache(maxsize=None)
def _generator_overload(func: Any) -> Optional[Any]:
    """The overload of ``func`` that takes a generator: ``func`` itself (``bernoulli_``, ``normal_``...), its
    ``generator`` twin for factories (``rand.default`` -> ``rand.generator``, ``randint.low`` ->
    ``randint.low_generator``), or ``None`` for operators that draw nothing."""
    if _has_generator(func):
        return func
    packet, name = getattr(func, "overloadpacket", None), getattr(func, "_overloadname", None)
    twin = getattr(packet, "generator" if name == "default" else f"{name}_generator", None) if packet else None
    return twin if twin is not None and _has_generator(twin) else None


def _op_device(args: tuple, kwargs: Dict[str, Any]) -> torch.device:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device
    device = kwargs.get("device")
    return torch.device(device) if device is not None else torch.device("cpu")


class ForeignCheckpointRandomness(RuntimeError, EncodingError):
    """A random operator of a replica on a repeated device inside a ``torch.utils.checkpoint`` region that does not
    restore the replica's stream: its recomputation would draw other values than the forward (wrong gradients)."""


_aware = threading.local()


def _top_pack_hook() -> Any:
    """The innermost saved-tensors pack hook of this thread (``None``: none, or a torch without the query)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    hooks = top(False) if top is not None else None
    return hooks[0] if hooks else None


@contextlib.contextmanager
def stream_restoring_checkpoint() -> Iterator[None]:
    """Inside (entered in the forward of a ``torch.utils.checkpoint`` region, by its ``context_fn``): the innermost
    checkpoint restores the replica's random stream when it recomputes (:func:`encoding.nn.checkpoint_module`)."""
    hooks = _aware.__dict__.setdefault("hooks", [])
    hooks.append(_top_pack_hook())
    try:
        yield
    finally:
        hooks.pop()


@functools.lru_cache(maxsize=None)
def _reentrant_forward_code() -> Any:
    """The code of ``torch.utils.checkpoint``'s reentrant forward (``CheckpointFunction.forward``), if this torch has
    it."""
    from torch.utils import checkpoint

    forward = getattr(getattr(checkpoint, "CheckpointFunction", None), "forward", None)
    return getattr(forward, "__code__", None)


def _in_reentrant_checkpoint() -> bool:
    """Whether this thread runs inside a reentrant ``torch.utils.checkpoint`` forward (its recomputation runs in
    backward, in the thread calling it, where no replica's stream is routed: nothing of ours can restore it)."""
    code, frame = _reentrant_forward_code(), sys._getframe(1)
    while code is not None and frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _in_foreign_checkpoint() -> bool:
    """Whether this thread runs the forward of a ``torch.utils.checkpoint`` region that does not restore the
    replica's stream: a reentrant one, or a non-reentrant one not entered through
    :func:`stream_restoring_checkpoint`."""
    if _in_reentrant_checkpoint():
        return True
    hook = _top_pack_hook()
    if hook is None or getattr(hook, "__module__", None) != "torch.utils.checkpoint" or \
            not getattr(hook, "__qualname__", "").startswith("_checkpoint_hook."):
        return False
    return not any(hook is ours for ours in getattr(_aware, "hooks", ()))


class ReplicaRandom(TorchDispatchMode):
    """Dispatch mode giving every random operator without an explicit generator ``generator`` instead.

    An operator is random when its schema has a ``generator`` argument (``bernoulli_`` under dropout, ``normal_``,
    ``uniform_``, ``randperm``, ``multinomial`` ...), or is CUDA's fused dropout (``native_dropout``, which has
    none: it is run as a mask drawn from ``generator``); only those on the generator's device are routed.
    Dispatch modes are thread-local, so each replica thread routes to its own generator.

    Args:
        generator: the stream to draw from.
    """

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.native_dropout.default and _same_device(args[0].device, self.generator.device):
            _refuse_foreign_checkpoint(func)
            return _native_dropout(self.generator, *args, **kwargs)
        overload = _generator_overload(func)
        if (overload is not None and kwargs.get("generator") is None
                and _same_device(_op_device(args, kwargs), self.generator.device)):
            _refuse_foreign_checkpoint(func)
            func, kwargs = overload, dict(kwargs, generator=self.generator)
        return func(*args, **kwargs)


def _refuse_foreign_checkpoint(func: Any) -> None:
    if _in_foreign_checkpoint():
        raise ForeignCheckpointRandomness(
            f"{func} inside torch.utils.checkpoint, in a replica on a repeated device: the recomputation would draw "
            "other random values than the forward, so the gradients would be wrong. Checkpoint with "
            "encoding.nn.checkpoint_module (or recompute= / --recompute), which restores the replica's stream; or "
            "run the replicas on distinct devices")


def _native_dropout(generator: torch.Generator, input: torch.Tensor, p: float,
                    train: Optional[bool]) -> Tuple[torch.Tensor, torch.Tensor]:
    """``aten.native_dropout`` (the fused dropout CUDA runs, whose schema has no generator) drawing its mask from
    ``generator``: the same outputs (the result and the boolean mask its backward uses)."""
    if train is not None and not train:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    keep = torch.empty_like(input).bernoulli_(1 - p, generator=generator)
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    return input * keep * scale, keep.bool()


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    return a.type == "cpu" or (a.index if a.index is not None else torch.cuda.current_device()) == b.index

