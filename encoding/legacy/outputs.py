"""PyTorch-Encoding's output layout: models returned the tuple ``(out[, se][, aux])`` where ours return
``{"out", ["se"], ["aux"]}``.

* :func:`pe_tuple` turns one output dict into PE's tuple;
* :func:`tuple_outputs` makes a model return PE's tuple (a forward hook: same module, same state dict), so code
  written for PE (``outputs[0]``, ``pred, se, aux = model(x)``) runs unchanged.
"""
from __future__ import annotations

from typing import Any, Mapping, Tuple

from torch import Tensor, nn

__all__ = ["pe_tuple", "tuple_outputs"]


def pe_tuple(outputs: Any) -> Tuple[Tensor, ...]:
    """``{"out", ["se"], ["aux"]}`` -> ``(out[, se][, aux])`` (PyTorch-Encoding's order); a tensor ``t`` -> ``(t,)``;
    a tuple or list is returned as a tuple.

    Raises:
        TypeError: a mapping without ``"out"``, or another type.
    """
    if isinstance(outputs, Tensor):
        return (outputs,)
    if isinstance(outputs, (tuple, list)):
        return tuple(outputs)
    if isinstance(outputs, Mapping) and "out" in outputs:
        return tuple(outputs[key] for key in ("out", "se", "aux") if key in outputs)
    raise TypeError(f"pe_tuple: expected a tensor, a tuple or a dict with 'out', got {type(outputs).__name__}")


def _tuple_hook(module: nn.Module, inputs: Any, outputs: Any) -> Tuple[Tensor, ...]:
    return pe_tuple(outputs)


def tuple_outputs(model: nn.Module) -> nn.Module:
    """Make ``model`` return PyTorch-Encoding's tuple ``(out[, se][, aux])`` instead of a dict; returns ``model``.

    A forward hook converts the output (idempotent; the state dict and the module type are unchanged; replicas of
    ``DataParallelModel`` keep the hook; ``encoding.nn.SegmentationLosses`` accepts the tuples).

    Example:
        >>> model = tuple_outputs(get_segmentation_model("encnet", nclass=4, backbone="resnet18", aux=True,
        ...                                              se_loss=True))
        >>> pred, se, aux = model(images)
    """
    if not getattr(model, "_pe_tuple_outputs", False):
        model.register_forward_hook(_tuple_hook)
        model._pe_tuple_outputs = True
    return model
