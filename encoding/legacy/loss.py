"""PyTorch-Encoding's loss argument layouts, served on top of the core criteria of :mod:`encoding.nn.loss`.

The core :class:`encoding.nn.loss.SegmentationLosses` / :class:`~encoding.nn.loss.OhemCrossEntropy` take one call,
``criterion(output_dict_or_tensor, target)``. PyTorch-Encoding's code calls them with an ``(out[, se][, aux])``
tuple, or flat as ``criterion(out, se, aux, target)`` (its ``DataParallelCriterion`` unpacked the outputs). The
subclasses here accept those layouts too (:func:`loss_inputs` turns them into the core call, then the core runs), and
``encoding.nn.SegmentationLosses`` / ``encoding.nn.OhemCrossEntropy`` are these subclasses (:data:`ALIASES
<encoding.legacy.ALIASES>`), so ``from encoding.nn import SegmentationLosses`` accepts every layout. They override
``loss_terms`` only, so :class:`encoding.parallel.DataParallelCriterion` reduces them exactly like the core.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

from torch import Tensor

from ..nn import loss as core
from ..parallel import LossTerm

__all__ = ["loss_inputs", "SegmentationLosses", "OhemCrossEntropy"]


def loss_inputs(inputs: Tuple[Any, ...], se_loss: bool, aux: bool) -> Tuple[Dict[str, Tensor], Any]:
    """PyTorch-Encoding's loss arguments as the core call ``(output_dict, target)``.

    Args:
        inputs: ``(output, target)`` with ``output`` a tensor or an ``(out[, se][, aux])`` tuple/list (the SE logits
            before the auxiliary output, as PE's EncNet returns them), or the flat ``(out[, se][, aux], target)``.
        se_loss: whether the criterion uses the SE logits.
        aux: whether the criterion uses the auxiliary output.

    Returns:
        ``({"out": ..., ["se": ...], ["aux": ...]}, target)``.

    Raises:
        ValueError: the number of tensors does not fit ``se_loss`` / ``aux``.
    """
    *preds, target = inputs
    output = preds[0] if len(preds) == 1 else tuple(preds)
    seq = (output,) if isinstance(output, Tensor) else tuple(output)
    if len(seq) != 1 + int(se_loss) + int(aux):
        layout = "(out" + (", se" if se_loss else "") + (", aux" if aux else "") + ")"
        raise ValueError(f"with se_loss={se_loss}, aux={aux} the model output must be {layout}, "
                         f"got {len(seq)} tensor(s)")
    named = {"out": seq[0]}
    if se_loss:
        named["se"] = seq[1]
    if aux:
        named["aux"] = seq[-1]
    return named, target


def _is_core_call(inputs: Tuple[Any, ...], extras: bool) -> bool:
    """Whether ``inputs`` is ``(output_dict, target)``, or ``(tensor, target)`` for a criterion without extra terms."""
    return len(inputs) == 2 and (isinstance(inputs[0], Mapping) or (isinstance(inputs[0], Tensor) and not extras))


class _PyTorchEncodingLayouts:
    """Mixin over a core criterion: accept PE's argument layouts, turned into the core call by :func:`loss_inputs`."""

    se_loss: bool
    aux: bool

    def loss_terms(self, *inputs: Any) -> List[LossTerm]:
        """The core ``loss_terms`` of ``inputs`` in any layout: ``(output_dict_or_tensor, target)``, an
        ``(out[, se][, aux])`` tuple/list with the target, or the flat ``(out[, se][, aux], target)``."""
        if len(inputs) >= 2 and not _is_core_call(inputs, extras=self.se_loss or self.aux):
            inputs = loss_inputs(inputs, se_loss=self.se_loss, aux=self.aux)
        return super().loss_terms(*inputs)  # type: ignore[misc]


_LAYOUTS = """

    PyTorch-Encoding layouts (``encoding.legacy``): besides the core call, ``output`` may be an
    ``(out[, se][, aux])`` tuple or list — PyTorch-Encoding's EncNet puts the SE logits *before* the auxiliary
    output — and the flat call ``criterion(out, se, aux, target)`` works too; both are turned into the core call by
    ``encoding.legacy.loss_inputs``. The core class, which takes only ``(output_dict_or_tensor, target)``, is
    ``encoding.nn.loss.{name}``.
"""


class SegmentationLosses(_PyTorchEncodingLayouts, core.SegmentationLosses):
    __doc__ = (core.SegmentationLosses.__doc__ or "").rstrip() + _LAYOUTS.format(name="SegmentationLosses")


class OhemCrossEntropy(core.OhemCrossEntropy, SegmentationLosses):
    __doc__ = (core.OhemCrossEntropy.__doc__ or "").rstrip() + _LAYOUTS.format(name="OhemCrossEntropy")
