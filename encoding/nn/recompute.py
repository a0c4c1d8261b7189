"""Exact activation checkpointing: recomputation that leaves BatchNorm state, synchronisation and randomness alone.

``torch.utils.checkpoint`` (non-reentrant) drops a region's activations in the forward and runs the region again
in the backward. Run naively, that second forward is a second training step for everything stateful inside it:
BatchNorm updates its running statistics twice (torch issue #96136), :class:`~encoding.nn.SyncBatchNorm` would
synchronise again (a second all-reduce, whose partners may be recomputing in another order or not at all) and
dropout would draw new masks when replicas share a generator. :func:`checkpoint_module` makes the recomputation
replay the forward instead:

* the running statistics (``running_mean``, ``running_var``, ``num_batches_tracked``) of every norm layer in the
  region are restored after the recomputation;
* values computed with :func:`replay_in_recomputation` (SyncBatchNorm's synchronised statistics) are recorded in
  the forward and handed back, in order, during the recomputation: no communication happens in the backward;
* the default generator's state is restored by torch, and a data-parallel replica's own stream
  (:attr:`encoding.parallel.ReplicaContext.generator`) is restored by us, so the masks are the forward's.

:func:`enable_checkpointing` turns it on for chosen submodules of a network without changing its state-dict keys,
and :func:`checkpoint_segmentation_model` applies the ``checkpoint=`` policies of
:func:`encoding.models.get_segmentation_model`.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterable, List, Tuple, Union

import torch
import torch.utils.checkpoint as torch_checkpoint
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _NormBase

from ..parallel import get_replica_context
from ..parallel.rng import ReplicaRandom, stream_restoring_checkpoint
from .class_swap import ClassSwap

__all__ = ["checkpoint_module", "replay_in_recomputation", "is_recomputing", "enable_checkpointing",
           "disable_checkpointing", "is_checkpointed", "RECOMPUTE_POLICIES", "checkpoint_segmentation_model"]

_local = threading.local()


class _Frame:
    """One checkpointed call: the values recorded in its forward and the state its recomputation must restore."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.records: List[Tuple[Tensor, bool]] = []
        context = get_replica_context()
        self.generator = context.generator if context is not None else None
        self.generator_state = self.generator.get_state() if self.generator is not None else None

    def contexts(self) -> Tuple["_Forward", "_Recompute"]:
        """The ``context_fn`` pair of ``torch.utils.checkpoint``."""
        return _Forward(self), _Recompute(self)


class _Cursor:
    """An entry of the thread's frame stack: a frame being recorded (forward) or replayed (recomputation)."""

    def __init__(self, frame: _Frame, replaying: bool) -> None:
        self.frame = frame
        self.replaying = replaying
        self.position = 0


def _stack() -> List[_Cursor]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


@contextlib.contextmanager
def _pushed(cursor: _Cursor):
    stack = _stack()
    stack.append(cursor)
    try:
        yield
    finally:
        stack.remove(cursor)


class _Forward:
    """Forward context of a checkpointed call: records what :func:`replay_in_recomputation` computes."""

    def __init__(self, frame: _Frame) -> None:
        self.cursor = _Cursor(frame, replaying=False)
        self.restoring = stream_restoring_checkpoint()

    def __enter__(self) -> None:
        _stack().append(self.cursor)
        self.restoring.__enter__()  # its random operators may draw from the replica's stream: it is restored

    def __exit__(self, *exc: Any) -> bool:
        self.restoring.__exit__(*exc)
        _stack().remove(self.cursor)
        return False


class _Recompute:
    """Recomputation context: replays the recorded values, restores the norm layers' running statistics and the
    replica's random stream. May be entered once per backward (``retain_graph=True``)."""

    def __init__(self, frame: _Frame) -> None:
        self.frame = frame
        self._exits: List[contextlib.ExitStack] = []

    def __enter__(self) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(_pushed(_Cursor(self.frame, replaying=True)))
        stack.enter_context(_running_stats_kept(self.frame.module))
        if self.frame.generator is not None:
            generator = torch.Generator(device=self.frame.generator.device)
            generator.set_state(self.frame.generator_state)
            stack.enter_context(ReplicaRandom(generator))
        self._exits.append(stack)

    def __exit__(self, *exc: Any) -> bool:
        self._exits.pop().close()
        return False


@contextlib.contextmanager
def _running_stats_kept(module: nn.Module):
    """Restore, on exit, the running statistics of every norm layer inside ``module``."""
    saved = [(buf, buf.clone()) for m in module.modules() if isinstance(m, _NormBase) and m.track_running_stats
             for buf in (m.running_mean, m.running_var, m.num_batches_tracked) if buf is not None]
    try:
        yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


def is_recomputing() -> bool:
    """Whether the calling code runs inside the recomputation of a checkpointed call."""
    return any(c.replaying for c in _stack())


def replay_in_recomputation(compute: Callable[[], Tensor]) -> Tensor:
    """``compute()`` in a forward; the same (recorded) value when a checkpointed region is recomputed.

    For operations that must happen once per step, such as synchronising statistics across replicas or processes:
    in the recomputation they would communicate a second time, with partners that may recompute in another order or
    not at all. Calls are matched by their order within the checkpointed region. Outside checkpointing this is just
    ``compute()``.

    Args:
        compute: returns a tensor (recorded detached; the forward's graph keeps the original).
    """
    stack = _stack()
    replaying = next((c for c in stack if c.replaying), None)
    if replaying is not None:
        records = replaying.frame.records
        if replaying.position >= len(records):
            raise RuntimeError("activation checkpointing: the recomputation made more synchronised calls than the "
                               "forward (the checkpointed region must run the same layers in the same order)")
        recorded, requires_grad = records[replaying.position]
        replaying.position += 1
        # a fresh leaf that requires grad like the original, so the recomputation records the same graph (and saves
        # the same tensors) as the forward
        value = recorded.detach().requires_grad_(requires_grad)
    else:
        value = compute()
    for cursor in stack:
        if not cursor.replaying:
            cursor.frame.records.append((value.detach(), value.requires_grad))
    return value


def checkpoint_module(module: nn.Module, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` (``module``'s forward) under exact non-reentrant activation checkpointing.

    Without grad mode it simply calls ``function``. See the module docstring for what the recomputation preserves.

    Args:
        module: the module whose computation ``function`` is (its norm layers' running statistics are kept).
        function: the computation, e.g. the module's original ``forward`` bound to it.
    """
    if not torch.is_grad_enabled():
        return function(*args, **kwargs)
    if torch.compiler.is_compiling():  # traced (--compile): the compiled backward recomputes pure operators only
        return torch_checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)
    frame = _Frame(module)
    return torch_checkpoint.checkpoint(function, *args, use_reentrant=False, context_fn=frame.contexts, **kwargs)


# -- turning it on for submodules ---------------------------------------------------------------------------------
class _Checkpointed:
    """Mixin of the generated ``Checkpointed<Class>`` classes: the forward runs under :func:`checkpoint_module`."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint_module(self, super().forward, *args, **kwargs)

    def __reduce_ex__(self, protocol: int) -> Any:
        # the generated class cannot be found by name: rebuild it from the importable base class
        reduced = super().__reduce_ex__(max(protocol, 2))
        return (_new_checkpointed, (type(self).__checkpoint_base__,)) + tuple(reduced[2:])


_SWAP = ClassSwap(_Checkpointed, "Checkpointed", "__checkpoint_base__")


def _new_checkpointed(base: type) -> nn.Module:
    """An empty instance of ``Checkpointed<base>`` (unpickling and ``copy.deepcopy``)."""
    return object.__new__(_SWAP.subclass(base))


def is_checkpointed(module: nn.Module) -> bool:
    """Whether :func:`enable_checkpointing` turned checkpointing on for ``module`` itself."""
    return _SWAP.applied(module)


def enable_checkpointing(modules: Union[nn.Module, Iterable[nn.Module]]) -> None:
    """Run every given module's forward under :func:`checkpoint_module` from now on.

    The module's class is swapped for a generated subclass ``Checkpointed<Class>`` (as
    ``torch.nn.utils.parametrize`` does), so parameters, buffers, state-dict keys, hooks and ``isinstance`` checks
    stay as they are, and data-parallel replicas, ``copy.deepcopy`` and pickling keep it.

    Args:
        modules: one module or several (e.g. every residual block of a backbone).
    """
    for module in [modules] if isinstance(modules, nn.Module) else modules:
        _SWAP.apply(module)


def disable_checkpointing(model: nn.Module) -> nn.Module:
    """Undo :func:`enable_checkpointing` for ``model`` and all its submodules; returns ``model``."""
    for module in model.modules():
        _SWAP.restore(module)
    return model


#: The activation-recomputation policies (``recompute=`` of :func:`encoding.models.get_segmentation_model`,
#: ``--recompute``, the memory advice's rows), cheapest in compute first: written once, here.
RECOMPUTE_POLICIES = ("none", "backbone", "all")


def _residual_blocks(backbone: nn.Module) -> List[nn.Module]:
    stages = backbone.stages() if hasattr(backbone, "stages") else []
    return [block for stage in stages for block in stage.children()]


def checkpoint_segmentation_model(model: nn.Module, policy: Union[bool, str, None]) -> nn.Module:
    """Apply a checkpointing policy to a :class:`~encoding.models.SegmentationModel`; returns ``model``.

    Args:
        model: the model (``backbone`` with ``stages()``, ``classifier``, optional ``aux_classifier`` / ``neck``).
        policy: ``False`` / ``None`` / ``"none"``: nothing; ``"backbone"``: every residual block of the backbone;
            ``"all"`` or ``True``: the blocks, the neck and the heads.

    Raises:
        ValueError: an unknown policy, or ``"backbone"`` for a backbone without residual stages.
    """
    policy = {False: "none", None: "none", True: "all"}.get(policy, policy)
    if policy not in RECOMPUTE_POLICIES:
        raise ValueError(f"recompute must be one of {', '.join(map(repr, RECOMPUTE_POLICIES))} (or True/False), "
                         f"got {policy!r}")
    if policy == "none":
        return model
    blocks = _residual_blocks(model.backbone)
    if not blocks:
        raise ValueError(f"recompute={policy!r} needs a backbone with residual stages (stages()), got "
                         f"{type(model.backbone).__name__}")
    enable_checkpointing(blocks)
    if policy == "all":
        heads = (getattr(model, name, None) for name in ("neck", "classifier", "aux_classifier"))
        enable_checkpointing([head for head in heads if head is not None])
    return model
