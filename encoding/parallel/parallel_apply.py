"""Run replicas concurrently in threads, carrying the caller's autograd/autocast state into every thread."""
from __future__ import annotations

import contextlib
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import EncodingError
from .devices import DeviceLike, resolve_device
from .rng import ReplicaRandom, draw_base_seed, replica_generator
from .structures import device_of

__all__ = ["ReplicaContext", "ReplicaAbortedError", "get_replica_context", "parallel_apply"]

_AUTOCAST_DEVICE_TYPES = ("cpu", "cuda")
_local = threading.local()


class ReplicaAbortedError(RuntimeError, EncodingError):
    """Raised by code inside a replica that stops waiting because another replica of the same call failed.

    :func:`parallel_apply` prefers the failing replica's own exception over these when it re-raises.
    """


@dataclass
class ReplicaContext:
    """What a replica thread knows about its call (see :func:`get_replica_context`).

    Attributes:
        index: the replica's index (0 = master copy).
        device: the replica's device.
        num_replicas: how many replicas run in this call.
        failed: set as soon as any replica of this call raised; code that waits on other replicas (e.g.
            SyncBatchNorm) polls it and raises :class:`ReplicaAbortedError` instead of hanging.
        generator: the replica's own random stream when its device is repeated in the call (several replicas
            would otherwise share that device's generator); its random operators draw from it (see
            :mod:`encoding.parallel.rng`). ``None`` on a device of its own.
    """

    index: int
    device: torch.device
    num_replicas: int
    failed: threading.Event
    generator: Optional[torch.Generator] = None


def get_replica_context() -> Optional[ReplicaContext]:
    """The :class:`ReplicaContext` of the calling replica thread, or ``None`` outside :func:`parallel_apply`."""
    return getattr(_local, "context", None)


@contextlib.contextmanager
def _replica_context(context: ReplicaContext):
    previous = getattr(_local, "context", None)
    _local.context = context
    try:
        yield
    finally:
        _local.context = previous


def _autocast_state(device_type: str) -> Tuple[bool, torch.dtype]:
    try:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except TypeError:  # torch < 2.4
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


@dataclass
class _ThreadState:
    """Thread-local state of the caller that every replica thread must see."""

    grad_enabled: bool
    inference_mode: bool
    autocast: Tuple[Tuple[str, bool, torch.dtype], ...]
    autocast_cache: bool

    @classmethod
    def capture(cls) -> "_ThreadState":
        return cls(grad_enabled=torch.is_grad_enabled(),
                   inference_mode=torch.is_inference_mode_enabled(),
                   autocast=tuple((dt,) + _autocast_state(dt) for dt in _AUTOCAST_DEVICE_TYPES),
                   autocast_cache=torch.is_autocast_cache_enabled())

    def enter(self, stack: contextlib.ExitStack, device: torch.device, stream: Any) -> None:
        if self.inference_mode:
            stack.enter_context(torch.inference_mode())
        else:
            stack.enter_context(torch.set_grad_enabled(self.grad_enabled))
        for device_type, enabled, dtype in self.autocast:
            if enabled:
                stack.enter_context(torch.autocast(device_type, dtype=dtype, cache_enabled=self.autocast_cache))
        if device.type == "cuda":
            stack.enter_context(torch.cuda.device(device))
            stack.enter_context(torch.cuda.stream(stream))


def _describe(index: int, device: torch.device, exc: BaseException) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"Caught {type(exc).__name__} in replica {index} on device {device}.\nOriginal traceback:\n{text}"


def _reraise(failures: Dict[int, Tuple[torch.device, BaseException]]) -> None:
    """Re-raise the first real failure (not a ReplicaAbortedError) as the original exception object."""
    index = min(failures, key=lambda i: (isinstance(failures[i][1], ReplicaAbortedError), i))
    device, exc = failures[index]
    note = _describe(index, device, exc)
    exc.replica_index, exc.replica_device = index, device
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python < 3.11: keep the text reachable on the exception
        exc.__notes__ = list(getattr(exc, "__notes__", [])) + [note]
    failures.clear()
    raise exc


def _replica_generators(devices: Sequence[torch.device]) -> List[Optional[torch.Generator]]:
    """One generator per replica whose device is repeated in ``devices`` (``None`` for the others)."""
    repeated = [devices.count(d) > 1 for d in devices]
    if not any(repeated):
        return [None] * len(devices)
    base = draw_base_seed()
    return [replica_generator(d, base, i) if shared else None for i, (d, shared) in enumerate(zip(devices, repeated))]


def parallel_apply(modules: Sequence[Callable[..., Any]], inputs: Sequence[Any],
                   kwargs_tup: Optional[Sequence[Optional[Dict[str, Any]]]] = None,
                   devices: Optional[Sequence[DeviceLike]] = None) -> List[Any]:
    """Call ``modules[i](*inputs[i], **kwargs_tup[i])`` concurrently, one thread per replica.

    Every thread sees the caller's grad mode, ``torch.inference_mode``, and autocast state (device type, enabled,
    dtype and cache flag), its replica's CUDA device and current stream, and a :class:`ReplicaContext`.
    Replicas whose device appears more than once get their own random stream (:attr:`ReplicaContext.generator`),
    seeded from one draw of the default generator and the replica index: runs repeat bit for bit under
    ``torch.manual_seed`` whatever order the threads run in.
    If replicas raise, all threads are joined first, then the first failure (by replica index, preferring real
    errors over :class:`ReplicaAbortedError`) is re-raised with its original type, carrying ``replica_index``,
    ``replica_device`` and a note with the replica's original traceback.

    Args:
        modules: one callable per replica (modules, or bound methods such as ``replica.train_step``).
        inputs: one positional-argument tuple per replica (a non-tuple is passed as the single argument).
        kwargs_tup: one keyword dict per replica (default: none).
        devices: one device per replica (default: the device of each replica's first tensor argument, else CPU).

    Returns:
        The outputs, in replica order.
    """
    if len(modules) != len(inputs):
        raise ValueError(f"parallel_apply got {len(modules)} modules but {len(inputs)} inputs")
    kwargs_tup = list(kwargs_tup) if kwargs_tup is not None else [{}] * len(modules)
    if len(kwargs_tup) != len(modules):
        raise ValueError(f"parallel_apply got {len(modules)} modules but {len(kwargs_tup)} kwargs")
    inputs = [args if isinstance(args, (tuple, list)) else (args,) for args in inputs]
    devices = ([resolve_device(d) for d in devices] if devices is not None
               else [device_of((a, k), torch.device("cpu")) for a, k in zip(inputs, kwargs_tup)])
    state = _ThreadState.capture()
    streams = [torch.cuda.current_stream(d) if d.type == "cuda" else None for d in devices]
    generators = _replica_generators(devices)
    failed = threading.Event()
    results: Dict[int, Any] = {}
    failures: Dict[int, Tuple[torch.device, BaseException]] = {}

    def worker(i: int) -> None:
        context = ReplicaContext(i, devices[i], len(modules), failed, generators[i])
        try:
            with contextlib.ExitStack() as stack:
                state.enter(stack, devices[i], streams[i])
                stack.enter_context(_replica_context(context))
                if generators[i] is not None:
                    stack.enter_context(ReplicaRandom(generators[i]))
                results[i] = modules[i](*inputs[i], **(kwargs_tup[i] or {}))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            failures[i] = (devices[i], exc)
            failed.set()

    if len(modules) == 1:
        worker(0)
    else:
        threads = [threading.Thread(target=worker, args=(i,), name=f"replica-{i}") for i in range(len(modules))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failures:
        _reraise(failures)
    return [results[i] for i in range(len(modules))]
