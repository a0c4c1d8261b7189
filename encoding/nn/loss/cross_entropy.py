"""The cross-entropy family's base: :class:`SegmentationLosses` (cross-entropy + auxiliary + SE terms) and
PyTorch-Encoding's argument layouts (:func:`loss_inputs`).

:class:`SegmentationLosses` implements the exact-reduction protocol of :mod:`encoding.parallel.reduction`:
``loss_terms`` returns the per-replica *sums* and *normalisers* of every term, so that
:class:`encoding.parallel.DataParallelCriterion` forms each mean over the whole batch (pixel terms over the valid
pixels of all replicas, the SE term over all images) and the result equals the single-device loss even for uneven
splits and uneven ignore masks. ``forward`` reduces the terms of one call, so on a single device the losses are
ordinary ``nn.Module`` criteria. Every other loss of :mod:`encoding.nn.loss` is a :class:`SegmentationLosses` whose
pixel term is replaced.

It is PyTorch-Encoding's class too (one class, whatever the import path): besides the call
``criterion(output_dict_or_tensor, target)`` it takes PE's argument layouts, an ``(out[, se][, aux])`` tuple or list
with the target, or the flat ``criterion(out, se, aux, target)`` (:func:`~encoding.nn.loss.loss_inputs` turns them
into the first).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...parallel.reduction import LossTerm, reduce_loss_terms, valid_count

__all__ = ["SegmentationLosses", "loss_inputs", "class_presence"]


def loss_inputs(inputs: Tuple[Any, ...], se_loss: bool, aux: bool) -> Tuple[Dict[str, Tensor], Any]:
    """PyTorch-Encoding's loss arguments as the call ``(output_dict, target)``.

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


def _is_pe_layout(inputs: Tuple[Any, ...]) -> bool:
    """Whether ``inputs`` is one of PE's layouts: a tuple/list output, or the flat ``(out, ..., target)`` call."""
    return (len(inputs) == 2 and isinstance(inputs[0], (tuple, list))) or (
        len(inputs) > 2 and all(isinstance(x, Tensor) for x in inputs))


class SegmentationLosses(nn.Module):
    """Cross-entropy + auxiliary cross-entropy + SE (semantic-encoding) loss, as in PyTorch-Encoding.

    ``loss = CE(out) + aux_weight * CE(aux) + se_weight * BCEWithLogits(se, present)`` where ``present[b, c]`` is 1 when
    class ``c`` occurs (not ignored) in image ``b`` of the target. The pixel terms are means over the non-ignored
    pixels (weighted by ``weight[target]`` when class weights are given, as ``nn.CrossEntropyLoss`` does); the SE term
    is the mean over ``images x nclass`` (class weights, if any, weight its columns, as PyTorch-Encoding's
    ``nn.BCELoss(weight)`` did).

    Args:
        se_loss: add the SE term; the model output must then carry the SE logits (``B x nclass``).
        se_weight: coefficient of the SE term.
        nclass: number of classes; ``-1`` takes it from the channels of the main output. When given, the outputs
            are checked against it.
        aux: add the auxiliary term; the model output must then carry the auxiliary logits.
        aux_weight: coefficient of the auxiliary term.
        weight: optional class weights (``nclass`` values) for the pixel terms and the SE term.
        ignore_index: target value of pixels that do not count (``-1`` in this package).
        label_smoothing: label smoothing of the pixel cross-entropies (as in ``nn.CrossEntropyLoss``).

    Inputs:
        The model output and the target, as ``criterion(output, target)``. ``output`` is a dict with ``"out"`` and,
        where used, ``"aux"`` / ``"se"`` (extra keys are ignored), or the bare ``out`` tensor. PyTorch-Encoding's
        layouts are accepted too: an ``(out[, se][, aux])`` tuple or list (the SE logits before the auxiliary
        output, as PE's EncNet returns them) with the target, or the flat ``criterion(out, se, aux, target)``
        (:func:`~encoding.nn.loss.loss_inputs`).

    Shape:
        - out, aux: ``B x nclass x H x W`` logits (any number of spatial dimensions, matching the target).
        - se: ``B x nclass`` logits.
        - target: ``B x H x W`` int64 class indices in ``[0, nclass)`` or ``ignore_index``.
        - Output: scalar.

    Raises:
        ValueError: a target value outside ``[0, nclass)`` that is not ``ignore_index`` (the message lists the bad
            values; checked with one min/max reduction, never a device-side assert), a missing output, or mismatched
            shapes.

    Example:
        >>> criterion = SegmentationLosses(se_loss=True, aux=True, nclass=7)
        >>> output = {"out": torch.randn(2, 7, 8, 8), "aux": torch.randn(2, 7, 8, 8), "se": torch.randn(2, 7)}
        >>> target = torch.randint(-1, 7, (2, 8, 8))
        >>> loss = criterion(output, target)
    """

    def __init__(self, se_loss: bool = False, se_weight: float = 0.2, nclass: int = -1, aux: bool = False,
                 aux_weight: float = 0.4, weight: Optional[Tensor] = None, ignore_index: int = -1,
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        if nclass == 0 or nclass < -1:
            raise ValueError(f"nclass must be positive or -1 (take it from the output), got {nclass}")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        if weight is not None:
            weight = torch.as_tensor(weight)
            if weight.dim() != 1 or (nclass > 0 and weight.numel() != nclass):
                raise ValueError(f"weight must hold one value per class (nclass={nclass}), got shape "
                                 f"{tuple(weight.shape)}")
        self.se_loss = se_loss
        self.se_weight = float(se_weight)
        self.nclass = nclass
        self.aux = aux
        self.aux_weight = float(aux_weight)
        self.ignore_index = ignore_index
        self.label_smoothing = float(label_smoothing)
        self.register_buffer("weight", weight)

    def extra_repr(self) -> str:
        return (f"se_loss={self.se_loss}, se_weight={self.se_weight}, nclass={self.nclass}, aux={self.aux}, "
                f"aux_weight={self.aux_weight}, ignore_index={self.ignore_index}, "
                f"label_smoothing={self.label_smoothing}")

    def forward(self, *inputs: Any) -> Tensor:
        """The loss of one call: ``reduce_loss_terms([self.loss_terms(*inputs)])``."""
        return reduce_loss_terms([self.loss_terms(*inputs)])

    def loss_terms(self, *inputs: Any) -> List[LossTerm]:
        """This call's loss as exact-reduction terms (the protocol of :mod:`encoding.parallel.reduction`).

        Args:
            *inputs: ``(output, target)``: the model output (a dict or a tensor) and the target.

        Returns:
            ``[main]``, then ``aux`` and ``se`` terms when enabled, in that order: each a :class:`LossTerm` holding
            the sum of this call's losses, its normaliser (valid pixels / summed class weights of valid pixels, or
            ``images x nclass``) and its coefficient.
        """
        out, aux, se, target = self._parse(inputs)
        nclass = out.shape[1]
        valid = self._check_target(target, out)
        terms = [self._pixel_term(out, target, valid, 1.0)]
        if self.aux:
            terms.append(self._pixel_term(aux, target, valid, self.aux_weight))
        if self.se_loss:
            terms.append(self._se_term(se, target, valid, nclass))
        return terms

    # -- input handling -------------------------------------------------------------------------------------------
    def _parse(self, inputs: Tuple[Any, ...]) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Tensor]:
        """``(out, aux, se, target)`` of the call ``(output_dict_or_tensor, target)`` or a PE layout."""
        if _is_pe_layout(inputs):
            inputs = loss_inputs(inputs, se_loss=self.se_loss, aux=self.aux)
        if len(inputs) != 2:
            raise TypeError(f"{type(self).__name__} expects (output, target), got {len(inputs)} argument(s)")
        if not isinstance(inputs[0], (Tensor, Mapping)):
            raise TypeError(f"the model output must be a dict, a tensor or an (out[, se][, aux]) tuple, got "
                            f"{type(inputs[0]).__name__}")
        output, target = inputs
        if not isinstance(target, Tensor):
            raise TypeError(f"target must be a tensor, got {type(target).__name__}")
        if isinstance(output, Tensor):
            output = {"out": output}
        if "out" not in output:
            raise ValueError(f"the model output dict has no 'out' entry (keys: {sorted(output)})")
        out, aux, se = output["out"], output.get("aux"), output.get("se")
        for name, wanted, value in (("aux", self.aux, aux), ("se", self.se_loss, se)):
            if wanted and value is None:
                raise ValueError(f"the criterion uses '{name}' but the model output dict has no '{name}' entry "
                                 f"(keys: {sorted(output)})")
        if self.nclass > 0 and out.shape[1] != self.nclass:
            raise ValueError(f"the output has {out.shape[1]} channels but nclass={self.nclass}")
        if aux is not None and self.aux and aux.shape != out.shape:
            raise ValueError(f"the aux output has shape {tuple(aux.shape)}, the main output {tuple(out.shape)}")
        if se is not None and self.se_loss and tuple(se.shape) != (out.shape[0], out.shape[1]):
            raise ValueError(f"the se output must be B x nclass = {(out.shape[0], out.shape[1])}, "
                             f"got {tuple(se.shape)}")
        return out, aux, se, target

    def _check_target(self, target: Tensor, out: Tensor) -> Tensor:
        """Check the target's shape and values; return the mask of non-ignored pixels."""
        if target.shape != out.shape[:1] + out.shape[2:]:
            raise ValueError(f"the target must be B x spatial = {tuple(out.shape[:1] + out.shape[2:])} for an "
                             f"output of shape {tuple(out.shape)}, got {tuple(target.shape)}")
        if target.is_floating_point() or target.is_complex():
            raise ValueError(f"the target must hold integer class indices, got dtype {target.dtype}")
        valid = target != self.ignore_index
        if target.numel():
            nclass = out.shape[1]
            lo, hi = torch.stack(torch.aminmax(target.masked_fill(~valid, 0))).tolist()  # one host sync
            if lo < 0 or hi >= nclass:
                bad = target[valid & ((target < 0) | (target >= nclass))].unique()
                shown = bad[:10].tolist()
                more = f" (and {bad.numel() - 10} more)" if bad.numel() > 10 else ""
                raise ValueError(f"target values {shown}{more} are outside [0, {nclass}) and are not "
                                 f"ignore_index={self.ignore_index}")
        return valid

    # -- terms ----------------------------------------------------------------------------------------------------
    def _class_weight(self, logits: Tensor) -> Optional[Tensor]:
        return None if self.weight is None else self.weight.to(device=logits.device, dtype=logits.dtype)

    def _pixel_term(self, logits: Tensor, target: Tensor, valid: Tensor, coeff: float) -> LossTerm:
        """Summed (weighted) cross-entropy over ``valid`` pixels and its normaliser."""
        weight = self._class_weight(logits)
        total = F.cross_entropy(logits, target, weight=weight, ignore_index=self.ignore_index, reduction="sum",
                                label_smoothing=self.label_smoothing)
        return LossTerm(total, valid_count(target, valid, weight), coeff)

    def _se_term(self, se: Tensor, target: Tensor, valid: Tensor, nclass: int) -> LossTerm:
        present = class_presence(target, valid, nclass).to(se.dtype)
        weight = self._class_weight(se)
        total = F.binary_cross_entropy_with_logits(se, present, weight=weight, reduction="sum")
        return LossTerm(total, se.numel(), self.se_weight)


def class_presence(target: Tensor, valid: Tensor, nclass: int) -> Tensor:
    """``B x nclass`` boolean: which classes occur among the valid pixels of each image."""
    flat = torch.where(valid, target, nclass).reshape(target.shape[0], -1)
    present = torch.zeros(target.shape[0], nclass + 1, dtype=torch.bool, device=target.device)
    present.scatter_(1, flat, True)
    return present[:, :nclass]
