"""Compiled training and inference (``--compile``): a network's forward through ``torch.compile``.

:func:`compile_model` swaps the network's class for a generated subclass ``Compiled<Class>`` (the pattern of
:func:`encoding.nn.recompute.enable_checkpointing` and ``torch.nn.utils.parametrize``), whose call goes through one
``torch.compile``\\ d function of ``(module, inputs)``. So:

* the parameters, buffers and state-dict keys are the module's own (no ``_orig_mod.`` prefix): a checkpoint saved
  from a compiled network loads into a plain one, and a resume loads into a compiled one;
* :class:`~encoding.parallel.DataParallelModel`'s replicas (new module objects each step, holding per-device copies
  of the parameters) share the compiled function and run compiled with their own tensors; DDP wraps the compiled
  network as any other;
* activation recomputation (``--recompute``) is traced as ``torch.utils.checkpoint`` regions;
* where compilation is not possible (no dynamo for this Python, no C++ compiler for inductor on a CPU, a failure to
  compile, or replicas under a dispatch mode: those on a repeated device) one line says why and the network runs
  eager.

Inductor is the backend: C++ kernels on a CPU (the system's compiler, ``g++`` / ``cc``, or ``CXX``), Triton on
CUDA; ``mode="reduce-overhead"`` adds CUDA graphs (the default on a single CUDA device, see :func:`compile_mode`).
"""
from __future__ import annotations

import os
import shutil
import types
import warnings
from typing import Any, Dict, Iterable, Optional

import torch
from torch import nn

from ..config.groups import COMPILE_CHOICES
from ..nn.class_swap import ClassSwap

__all__ = ["COMPILE_CHOICES", "CompileWarning", "compile_mode", "compile_problem", "capped_cpu_kernels",
           "compile_model", "is_compiled", "eager_module"]


class CompileWarning(RuntimeWarning):
    """The network runs eager although compilation was asked (the message says why, in one line)."""


def compile_mode(choice: str, devices: Iterable[torch.device]) -> Optional[str]:
    """The ``torch.compile`` mode of a ``--compile`` choice (``None``: eager).

    ``auto`` is ``reduce-overhead`` (CUDA graphs) on one CUDA device per process, else ``default``: CUDA graphs
    need static memory per device, which replicas running in threads on several devices do not have.
    """
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"unknown compile choice {choice!r}; valid: {', '.join(COMPILE_CHOICES)}")
    if choice == "none":
        return None
    devices = list(devices)
    if choice == "auto":
        return "reduce-overhead" if len(devices) == 1 and devices[0].type == "cuda" else "default"
    return choice


def compile_problem(devices: Iterable[torch.device]) -> Optional[str]:
    """Why ``torch.compile`` cannot run here (one line), or ``None``."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python / platform"
    if any(d.type == "cpu" for d in devices):
        from torch._inductor import config

        names = [n for n in config.cpp.cxx if n] if isinstance(config.cpp.cxx, tuple) else [config.cpp.cxx]
        if not any(shutil.which(n) for n in names + ["g++", "c++", "clang++"]):
            return "inductor compiles CPU kernels with a C++ compiler and none was found (install g++ or set CXX)"
    return None


class _Compilation:
    """The compiled function of one network, shared by its replicas; eager from the first failure to compile (a
    new input shape or mode compiles again)."""

    def __init__(self, options: Dict[str, Any]) -> None:
        self.options = options
        # a code object of its own: dynamo caches graphs (and counts recompilations) per code object, so networks
        # compiled in one process do not share a cache or its limit
        call = types.FunctionType(_call.__code__.replace(), _call.__globals__, "compiled_call")
        self.function = torch.compile(call, **options)
        self.eager = False
        self.told = False

    def __call__(self, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.eager or _simulated():  # the memory simulations (fake tensors) follow the eager code
            return module._call_impl(*args, **kwargs)
        if torch._C._len_torch_dispatch_stack():  # torch.compile does not trace under a dispatch mode: say so
            if not self.told:
                self.told = True
                warnings.warn(f"--compile: {type(module).__name__} runs eager under a dispatch mode (e.g. the "
                              "per-replica random streams of DataParallelModel replicas on a repeated device)",
                              CompileWarning, stacklevel=3)
            return module._call_impl(*args, **kwargs)
        try:
            return self.function(module, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - compilation's many exception types
            if not _is_compile_error(error):
                raise
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            warnings.warn(f"--compile: {type(module).__name__} could not be compiled ({type(error).__name__}: "
                          f"{first[:200]}); running eager", CompileWarning, stacklevel=3)
            self.eager = True  # for good: an error of the network itself is raised by its eager code, with its
            return module._call_impl(*args, **kwargs)  # traceback


def _simulated() -> bool:
    """Whether a ``FakeTensorMode`` is active (the memory tool's and the window budget's simulations)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return any(isinstance(mode, FakeTensorMode) for mode in _get_current_dispatch_mode_stack())


def capped_cpu_kernels(devices: Iterable[torch.device]) -> bool:
    """Whether the network runs on a CPU with ATen's kernels capped by ``ATEN_CPU_CAPABILITY``: then inductor's
    graph cache is not used (:func:`compile_model`). torch keys that cache without the capability, so a graph
    compiled once without the variable (or with another value) is served again with kernels of the other
    instruction set (torch 2.14: a network's graph compiled under AVX-512, read under ``avx2``, gave outputs of
    1e23; under ``default``, a compile error). The C++ kernels' own cache is keyed by their instruction set and
    stays on."""
    return bool(os.environ.get("ATEN_CPU_CAPABILITY", "").strip()) and any(d.type == "cpu" for d in devices)


def _call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module._call_impl(*args, **kwargs)


def _is_compile_error(error: Exception) -> bool:
    """Whether ``error`` comes from dynamo / inductor (not from the network's own computation)."""
    from torch._dynamo.exc import TorchDynamoException

    return isinstance(error, TorchDynamoException) or type(error).__module__.startswith(("torch._inductor",
                                                                                          "torch._dynamo"))


class _CompiledCall:
    """``Module._compiled_call_impl`` of the generated classes: the shared compiled function, bound to the module
    it is read from (the network or one of its replicas)."""

    def __get__(self, module: Optional[nn.Module], owner: type) -> Any:
        if module is None:
            return self
        compilation = module.__dict__.get("_compilation")
        return None if compilation is None else (lambda *a, **k: compilation(module, *a, **k))

    def __set__(self, module: nn.Module, value: Any) -> None:
        if value is not None:  # nn.Module.compile() on a compiled network: one compilation is enough
            raise ValueError(f"{type(module).__name__} is compiled already (encoding.engine.compile_model)")


class _Compiled:
    """Mixin of the generated ``Compiled<Class>`` classes."""

    _compiled_call_impl = _CompiledCall()

    def __reduce_ex__(self, protocol: int) -> Any:
        # pickled or copied: the eager network (the compiled function is this process's)
        reduced = super().__reduce_ex__(max(protocol, 2))
        state = {k: v for k, v in reduced[2].items() if k != "_compilation"} if isinstance(reduced[2], dict) \
            else reduced[2]
        return (_new_eager, (type(self).__compile_base__,), state) + tuple(reduced[3:])


_SWAP = ClassSwap(_Compiled, "Compiled", "__compile_base__")


def _new_eager(base: type) -> nn.Module:
    return object.__new__(base)


def is_compiled(module: nn.Module) -> bool:
    """Whether :func:`compile_model` compiled ``module``."""
    return _SWAP.applied(module)


def eager_module(module: nn.Module) -> nn.Module:
    """Undo :func:`compile_model` (``module`` runs eager again); returns ``module``."""
    if is_compiled(module):
        module.__dict__.pop("_compilation", None)
    return _SWAP.restore(module)


def compile_model(model: nn.Module, mode: Optional[str] = "default", *, dynamic: Optional[bool] = None,
                  fullgraph: bool = False, backend: str = "inductor",
                  devices: Optional[Iterable[torch.device]] = None) -> nn.Module:
    """Compile ``model``'s forward with ``torch.compile`` in place; returns ``model``.

    Args:
        model: the network (not a DDP / DataParallel wrapper: compile the network, then wrap it).
        mode: a ``torch.compile`` mode (``"default"``, ``"reduce-overhead"``: CUDA graphs, ``"max-autotune"``), or
            ``None`` for torch's default.
        dynamic, fullgraph, backend: as ``torch.compile``'s (``dynamic=False``: one graph per input shape, the
            quickest to compile; ``None``: dynamic shapes after a second shape).
        devices: where the network runs (default: its parameters' devices), for :func:`compile_problem`.

    Where compilation is not possible, a one-line :class:`CompileWarning` says why and ``model`` stays eager; a
    failure to compile on the first call does the same then. With ``ATEN_CPU_CAPABILITY`` set on a CPU, inductor's
    graph cache is not used (:func:`capped_cpu_kernels`: torch does not key it by the capability).
    """
    if is_compiled(model):
        return model
    if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        raise ValueError(f"compile_model: compile the network, then wrap it ({type(model).__name__} given)")
    devices = list(devices) if devices is not None else list({p.device for p in model.parameters()}) or \
        [torch.device("cpu")]
    problem = compile_problem(devices)
    if problem:
        warnings.warn(f"--compile: {problem}; running eager", CompileWarning, stacklevel=2)
        return model
    options: Dict[str, Any] = dict(dynamic=dynamic, fullgraph=fullgraph, backend=backend)
    if backend == "inductor" and capped_cpu_kernels(devices):
        options["options"] = {**torch._inductor.list_mode_options(mode or "default"), "fx_graph_cache": False}
    elif mode not in (None, "default"):
        options["mode"] = mode
    model.__dict__.pop("_compiled_call_impl", None)  # nn.Module.__init__'s None: the class's descriptor reads it
    model.__dict__["_compilation"] = _Compilation(options)
    return _SWAP.apply(model)
