"""What each storage of one simulated training step is: the simulator's observer for the memory timeline
(:mod:`encoding.memory.timeline`).

:class:`Labeler` is :func:`~encoding.memory.simulate.simulate_program`'s ``observer``: while the measured step runs on
fake tensors it notes, for every storage the tracker counts, the phase (forward, backward, gradients, optimizer step)
and what made it (the innermost module; in backward the module whose forward made the autograd node), and at the
step's landmarks which storages are parameters, gradients, optimizer state, outputs and the activations autograd
keeps for backward (:data:`KINDS`).
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor, nn

from .program import DISTRIBUTED, DeviceProgram

__all__ = ["KINDS", "KIND_NAMES", "Labeler"]

#: What the bytes of a step are, in stacking order (what is held all step long first).
KINDS: Tuple[str, ...] = ("parameters", "optimizer", "communication", "gradients", "activations", "outputs",
                          "temporaries")
#: The kinds in words (legends).
KIND_NAMES = {"parameters": "parameters and buffers", "optimizer": "optimizer state", "gradients": "gradients",
              "activations": "activations kept for backward", "outputs": "outputs", "communication":
              "communication buffers", "temporaries": "temporaries"}
#: The autograd nodes of :mod:`encoding.memory.program` whose backward receives a gradient from another device.
_RECEIVING = ("_ShipBackward",)


def _storages(value: Any) -> Iterator[Any]:
    """The storages of a tensor (a wrapper subclass such as DTensor: of its inner tensors), or of a nest of them."""
    if isinstance(value, Tensor):
        if hasattr(value, "__tensor_flatten__"):
            for name in value.__tensor_flatten__()[0]:
                yield from _storages(getattr(value, name))
        else:
            yield value.untyped_storage()
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _storages(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _storages(item)


class Labeler:
    """What each storage of one simulated step is (see the module's docstring); holds no tensor, only weak
    references, so the step it watches holds what it would hold without it.

    Args:
        program: the device program simulated (its strategy tells what an unnamed storage held before the step is:
            DDP's gradient buckets under ``ddp`` / ``zero1`` / ``fsdp``, a buffer otherwise).
    """

    def __init__(self, program: DeviceProgram) -> None:
        self.program = program
        self.phase = "setup"
        self.phases: List[Tuple[str, int]] = []  # (phase, index of its first event)
        self.labels: Dict[int, Tuple[str, str]] = {}  # allocation event -> (phase, made by)
        self._refs: Dict[int, weakref.ref] = {}  # allocation event -> its storage
        self._index: Dict[int, int] = {}  # storage key -> its latest allocation event
        self.start: Dict[int, Tuple[weakref.ref, int]] = {}  # storages held when the step starts: key -> (ref, bytes)
        self.sets: Dict[str, set] = {k: set() for k in ("gradients", "optimizer", "outputs", "activations",
                                                        "communication")}
        self.start_kind: Dict[int, str] = {}
        self.start_made: Dict[int, str] = {}
        self.model: Optional[nn.Module] = None
        self._names: Dict[int, str] = {}
        self._stack: List[str] = []
        self._events: List[tuple] = []
        self._handles: List[Any] = []
        #: learned workspaces while the step runs: (index of the next event, bytes, what)
        self.workspaces: List[Tuple[int, int, str]] = []

    # ------------------------------------------------------------------------------------------- the tracker's calls
    def started(self, tracker: Any) -> None:
        """The measured step starts: note what is held."""
        self._events = tracker.events
        self.start = {key: (weakref.ref(storage), size) for key, (storage, size) in tracker.live_storages().items()}
        self._enter("forward")

    def marked(self, tracker: Any) -> None:
        """Forward and backward are done: the parameters' gradients are there."""
        if self.model is not None:
            self._note("gradients", [p.grad for p in self.model.parameters()])
        self._enter("gradients")

    def allocated(self, tracker: Any, key: int, storage: Any) -> None:
        """A new storage, the tracker's latest event."""
        index = len(self._events) - 1
        node = torch._C._current_autograd_node()
        if node is not None and self.phase == "forward":
            self._enter("backward", index)
        made = self._stack[-1] if self._stack else ""
        if self.phase == "forward" and not made and self.model is not None and not torch.is_grad_enabled():
            self.sets["outputs"].add(index)  # a custom autograd Function's forward: gather's whole-batch outputs
        if node is not None:
            if node.name() in _RECEIVING:
                self.sets["communication"].add(index)
            made = f"{made} (recomputed)" if made else f"{node.metadata.get('encoding.module', node.name())} backward"
        self.labels[index] = (self.phase, made or self._default_maker())
        self._refs[index], self._index[key] = weakref.ref(storage), index

    def workspace(self, tracker: Any, name: str, held: int) -> None:
        """An operator about to run holds ``held`` bytes of learned workspace (``--calibrate``) beyond what is
        live: a moment of the step before its next event."""
        if tracker.events is not None and tracker.events is self._events:
            self.workspaces.append((len(self._events), held, f"{name.split('::')[-1]} workspace (learned)"))

    # ------------------------------------------------------------------------------------------ hooks while it runs
    def __enter__(self) -> "Labeler":
        from torch.nn.modules import module as modules
        from torch.optim import optimizer as optimizers

        self._handles = [modules.register_module_forward_pre_hook(self._pre),
                         modules.register_module_forward_hook(self._post),
                         optimizers.register_optimizer_step_pre_hook(self._step),
                         optimizers.register_optimizer_step_post_hook(self._stepped)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _pre(self, module: nn.Module, args: Any) -> None:
        if id(module) not in self._names:  # a root (a model, a loss), or a module made on the fly
            prefix = self._stack[-1] + "." if self._stack else ""
            self._names.update({id(m): prefix + (n or type(module).__name__) for n, m in module.named_modules()})
        if not self._stack and self.phase == "forward":
            if self.model is None:
                self.model = module
                self._note_start(module)
            else:  # a loss: what it receives are the outputs (gathered on device 0 under gather)
                self._note("outputs", args)
        self._stack.append(self._names[id(module)])

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        self._stack.pop()
        for tensor in _tensors(output):
            if tensor.grad_fn is not None and "encoding.module" not in tensor.grad_fn.metadata:
                tensor.grad_fn.metadata["encoding.module"] = self._names[id(module)]
        if not self._stack and self.phase not in ("setup", "backward"):
            self._note("outputs", output)

    def _step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.phase == "setup":
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self._note("gradients", [p.grad for p in params])
        for p in params:
            for storage in _storages(p):
                self.start_kind.setdefault(id(storage), "parameters")
        self._stepped(optimizer, args, kwargs)
        if self.phase != "optimizer":
            self._enter("optimizer")

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.phase != "setup":
            self._note("optimizer", list(optimizer.state.values()))

    # -------------------------------------------------------------------------------------------------- the labels
    def _enter(self, phase: str, index: Optional[int] = None) -> None:
        index = len(self._events) if index is None else index
        if phase == "backward":  # what forward made and is still held: autograd keeps it (or the loop: outputs)
            self.sets["activations"].update(i for i, ref in self._refs.items()
                                            if self.labels[i][0] == "forward" and ref() is not None)
        self.phase = phase
        self.phases.append((phase, index))

    def _default_maker(self) -> str:
        if self.phase == "forward":
            return "step inputs" if self.model is None else "gather" if not torch.is_grad_enabled() else "loss"
        return {"gradients": "gradient reduction", "optimizer": "optimizer step"}.get(self.phase, self.phase)

    def _note(self, kind: str, value: Any) -> None:
        """Storages of ``value`` are ``kind``: an allocation of the step, or a storage held before it."""
        for storage in _storages(value):
            index = self._index.get(id(storage))
            if index is not None and self._refs[index]() is storage:
                self.sets[kind].add(index)
            elif id(storage) in self.start:
                self.start_kind.setdefault(id(storage), kind)

    def _note_start(self, model: nn.Module) -> None:
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            for storage in _storages(tensor):
                self.start_kind[id(storage)] = "parameters"
                self.start_made[id(storage)] = name

    def kind(self, index: int) -> str:
        """The kind of the storage of allocation event ``index``."""
        for kind in ("gradients", "optimizer", "communication", "outputs", "activations"):
            if index in self.sets[kind]:
                return kind
        return "temporaries"

    def held_kind(self, key: int) -> str:
        """The kind of a storage held when the step started."""
        if key in self.start_kind:
            return self.start_kind[key]
        return "communication" if self.program.strategy in DISTRIBUTED else "parameters"


def _tensors(value: Any) -> List[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []
