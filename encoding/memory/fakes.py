"""Fake tensors for the simulator (:mod:`encoding.memory.simulate`): the mode, models built in it, and what keeps
simulating them fast."""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterator

import torch
from torch import nn

from .program import StepSpec

__all__ = ["new_fake_mode", "build_fake_model", "without_constants", "frozen_heap"]


def new_fake_mode() -> Any:
    """A ``FakeTensorMode`` that accepts real tensors as constants."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def build_fake_model(spec: StepSpec, fake_mode: Any) -> nn.Module:
    """``spec.build_model()`` with fake tensors of ``fake_mode``.

    A constructor that reads a tensor's value (timm's drop-path rates, ``torch.linspace(...).tolist()``, in its
    newer versions) cannot run under fake tensors: such a model is built on the meta device and its parameters and
    buffers are then made fake CPU tensors of the same shapes (``to_empty`` under ``fake_mode``).
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException

    try:
        with fake_mode:
            return without_constants(spec.build_model())
    except DataDependentOutputException:
        with torch.device("meta"):
            model = spec.build_model()
        with fake_mode:
            return model.to_empty(device="cpu")


def without_constants(model: nn.Module) -> nn.Module:
    """``model`` with the values its fake tensors carry dropped: a tensor made from data (BatchNorm's
    ``num_batches_tracked``, ``torch.tensor(0)``) keeps it as a constant, and every operator on such a tensor
    bypasses ``FakeTensorMode``'s cache (its slow path, on every BatchNorm call). No simulated step reads those
    values: the tracker answers every host read
    (:class:`~encoding.memory.tracker.AllocationTracker`); the shapes and storages are the same."""
    for tensor in list(model.parameters()) + list(model.buffers()):
        if getattr(tensor, "constant", None) is not None:
            tensor.constant = None
    return model


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Inside: the objects alive before (torch's own, the models) left out of the garbage collector's passes
    (``gc.freeze``). A simulated step makes many objects, and every full collection would scan the whole heap again
    (a tenth of the advice's time); what the step drops, in reference cycles too, is collected as before. Nothing
    changes where the caller froze objects of its own."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
