"""Segmentation metrics built on one confusion matrix.

:class:`SegmentationMetric` accumulates an ``nclass x nclass`` confusion matrix (rows: target class, columns:
predicted class) with a single ``torch.bincount`` per update, on the device that holds the predictions. Every score
(pixel accuracy, IoU, accuracy, Dice, frequency-weighted IoU) is derived from that matrix, so the scores always agree
with each other and a distributed evaluation only has to all-reduce one small integer tensor.

Difference from PyTorch-Encoding: PE divided by ``union + eps`` and averaged over *all* classes, so a class absent from
both the predictions and the targets counted as IoU 0 and dragged mIoU down. Here such a class has IoU ``NaN`` and the
means are NaN-aware (``nanmean``): only classes that occur in the target or in the predictions are averaged. A class
that is predicted but absent from the target still counts (its IoU is 0).

The PE functional helpers :func:`batch_pix_accuracy`, :func:`batch_intersection_union`, :func:`pixel_accuracy` and
:func:`intersection_and_union` keep their PE signatures and return values.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from .dist import reduce_across_processes

__all__ = [
    "SegmentationMetric",
    "main_output",
    "confusion_matrix",
    "scores_from_confusion",
    "format_table",
    "batch_pix_accuracy",
    "batch_intersection_union",
    "pixel_accuracy",
    "intersection_and_union",
]

Output = Union[Tensor, Mapping[str, Any], Sequence[Any]]


# ----------------------------------------------------------------------------------------------------------------------
# Input handling
# ----------------------------------------------------------------------------------------------------------------------
def main_output(output: Any) -> Tensor:
    """The segmentation logits/labels of one model output: a tensor, ``output["out"]`` or ``output[0]``."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping):
        if "out" not in output:
            raise KeyError(f"model output dict has no 'out' entry (keys: {sorted(map(str, output))})")
        return output["out"]
    if isinstance(output, (list, tuple)) and output and isinstance(output[0], Tensor):
        return output[0]  # PyTorch-Encoding models returned (out, aux, ...) tuples
    raise TypeError(f"expected a tensor, a dict with 'out' or an (out, ...) tuple, got {type(output).__name__}")


def _to_labels(preds: Tensor, target: Tensor, nclass: Optional[int]) -> Tuple[Tensor, bool]:
    """Turn logits ``[B]xCxHxW`` or labels ``[B]xHxW`` into int64 labels shaped like ``target``.

    ``nclass`` (when given) must equal the number of logit channels.

    Returns:
        ``(labels, from_logits)``; labels from an argmax are always in ``[0, nclass)`` and need no range check.
    """
    if target.is_floating_point() or target.is_complex():
        raise TypeError(f"target must hold integer class indices, got dtype {target.dtype} (note the argument "
                        "order is update(preds_or_logits, target); PyTorch-Encoding used update(labels, preds))")
    if preds.shape == target.shape:
        if preds.is_floating_point() or preds.is_complex():
            raise TypeError(f"predictions shaped like the target {tuple(target.shape)} must be integer labels, got "
                            f"dtype {preds.dtype}; pass logits with a class dimension instead")
        return preds.long(), False
    if preds.dim() == target.dim() + 1:
        class_dim = 0 if target.dim() <= 2 else 1
        shape = preds.shape[:class_dim] + preds.shape[class_dim + 1:]
        if shape == target.shape:
            if nclass is not None and preds.shape[class_dim] != nclass:
                raise ValueError(f"logits have {preds.shape[class_dim]} channels in dim {class_dim} but the metric "
                                 f"has nclass={nclass}")
            return preds.argmax(dim=class_dim), True
    raise ValueError(f"predictions of shape {tuple(preds.shape)} do not match target of shape "
                     f"{tuple(target.shape)}: expected logits [B]xCxHxW or labels [B]xHxW")


def _bad_values(values: Tensor, limit: int = 10) -> str:
    found = torch.unique(values).tolist()
    text = ", ".join(map(str, found[:limit]))
    return text + (f", ... ({len(found)} distinct)" if len(found) > limit else "")


def confusion_matrix(preds: Tensor, target: Tensor, nclass: int, ignore_index: int = -1) -> Tensor:
    """Confusion matrix of one batch, computed with a single ``bincount`` on the predictions' device.

    Args:
        preds: logits ``[B]xCxHxW`` (argmax over ``C``) or integer labels shaped like ``target``.
        target: integer labels ``[B]xHxW``; ``ignore_index`` marks pixels that are not scored. It is moved to the
            predictions' device.
        nclass: number of classes ``C``.
        ignore_index: label of unscored pixels (PyTorch-Encoding convention: ``-1``).

    Returns:
        An ``nclass x nclass`` int64 tensor on ``preds.device``; entry ``[t, p]`` counts pixels of target class ``t``
        predicted as ``p``.

    Raises:
        ValueError: a target value outside ``[0, nclass)`` that is not ``ignore_index`` (or a predicted label outside
            ``[0, nclass)``); the message names the offending values.

    Example:
        >>> confusion_matrix(torch.tensor([0, 1, 1]), torch.tensor([0, 1, -1]), nclass=2)
        tensor([[1, 0],
                [0, 1]])
    """
    if nclass < 1:
        raise ValueError(f"nclass must be >= 1, got {nclass}")
    labels, from_logits = _to_labels(preds, target, nclass)
    n = int(nclass)
    target = target.to(device=labels.device, dtype=torch.int64, non_blocking=True)
    if target.numel() == 0:
        return torch.zeros(n, n, dtype=torch.int64, device=labels.device)
    if not from_logits:
        lo, hi = torch.aminmax(labels)
        if lo.item() < 0 or hi.item() >= n:
            bad = labels[(labels < 0) | (labels >= n)]
            raise ValueError(f"predicted labels must lie in [0, {n}), got {_bad_values(bad)}")
    lo, hi = (v.item() for v in torch.aminmax(target))
    ignore = int(ignore_index)
    ignore_outside = not 0 <= ignore < n
    if ignore_outside and 0 <= lo and hi < n:
        # Nothing to ignore: every pixel is scored.
        index = torch.add(labels, target, alpha=n)
        return torch.bincount(index.flatten(), minlength=n * n).reshape(n, n)
    if ignore == -1 and lo >= -1 and hi < n:
        # Only ignore pixels are out of range: shift them into an extra leading row that is dropped.
        index = torch.add(labels, target, alpha=n).add_(n)
        return torch.bincount(index.flatten(), minlength=n * (n + 1))[n:].reshape(n, n)
    # General case (e.g. ignore_index=255, ignore inside the class range, or invalid values present).
    scored = target != ignore
    bad = scored & ((target < 0) | (target >= n))
    if bool(bad.any()):
        raise ValueError(f"target values must lie in [0, {n}) or equal ignore_index={ignore}, "
                         f"got {_bad_values(target[bad])}")
    index = torch.where(scored, torch.add(labels, target, alpha=n), n * n)
    return torch.bincount(index.flatten(), minlength=n * n + 1)[: n * n].reshape(n, n)


# ----------------------------------------------------------------------------------------------------------------------
# Scores
# ----------------------------------------------------------------------------------------------------------------------
def _nanmean(values: Tensor) -> float:
    finite = values[~torch.isnan(values)]
    return float(finite.mean()) if finite.numel() else math.nan


def scores_from_confusion(confusion: Tensor) -> Dict[str, Any]:
    """Every score derived from a confusion matrix (rows: target, columns: prediction).

    Args:
        confusion: ``nclass x nclass`` counts.

    Returns:
        A dict with Python floats ``pixAcc``, ``mIoU``, ``mAcc`` (mean class accuracy), ``fwIoU`` (IoU weighted by
        target frequency) and ``mDice``; float64 CPU tensors ``IoU``, ``Acc`` and ``Dice`` (one entry per class,
        ``NaN`` where undefined: IoU/Dice when the class is in neither target nor prediction, Acc when it is absent
        from the target); and ``confusion`` (int64 CPU tensor). Means skip ``NaN`` classes; every score is ``NaN``
        when no pixel was scored.
    """
    conf = confusion.detach().to("cpu", torch.float64)
    tp = conf.diagonal()
    target_area = conf.sum(dim=1)
    pred_area = conf.sum(dim=0)
    total = float(target_area.sum())
    nan = torch.tensor(math.nan, dtype=torch.float64)
    union = target_area + pred_area - tp
    iou = torch.where(union > 0, tp / union.clamp(min=1), nan)
    acc = torch.where(target_area > 0, tp / target_area.clamp(min=1), nan)
    dice = torch.where(union > 0, 2 * tp / (target_area + pred_area).clamp(min=1), nan)
    if total > 0:
        freq = target_area / total
        present = freq > 0
        fw_iou = float((freq[present] * iou[present]).sum())
        pix_acc = float(tp.sum()) / total
    else:
        fw_iou = pix_acc = math.nan
    return {
        "pixAcc": pix_acc,
        "mIoU": _nanmean(iou),
        "mAcc": _nanmean(acc),
        "fwIoU": fw_iou,
        "mDice": _nanmean(dice),
        "IoU": iou,
        "Acc": acc,
        "Dice": dice,
        "confusion": confusion.detach().to("cpu", torch.int64),
    }


def format_table(result: Mapping[str, Any], class_names: Optional[Sequence[str]] = None, digits: int = 2) -> str:
    """Per-class IoU / accuracy table followed by the summary scores, in percent.

    Args:
        result: the dict of :meth:`SegmentationMetric.compute` (or :func:`scores_from_confusion`).
        class_names: one name per class (default: the class indices).
        digits: decimals of the percentages.

    Returns:
        A multi-line string; undefined entries (class never seen) are shown as ``-``.

    Example:
        >>> print(format_table(metric.compute(), ["background", "disc"]))  # doctest: +SKIP
        class        IoU    Acc
        background  97.10  98.52
        ...
    """
    iou = [float(v) for v in result["IoU"]]
    acc = [float(v) for v in result["Acc"]]
    names = [str(i) for i in range(len(iou))] if class_names is None else [str(name) for name in class_names]
    if len(names) != len(iou):
        raise ValueError(f"class_names has {len(names)} entries but the result has {len(iou)} classes")

    def pct(value: float) -> str:
        return "-" if math.isnan(value) else f"{100.0 * value:.{digits}f}"

    rows = [("class", "IoU", "Acc")] + [(name, pct(i), pct(a)) for name, i, a in zip(names, iou, acc)]
    width = max(len(row[0]) for row in rows)
    num = max(max(len(row[1]), len(row[2])) for row in rows)
    lines = [f"{a:<{width}}  {b:>{num}}  {c:>{num}}" for a, b, c in rows]
    lines.insert(1, "-" * len(lines[0]))
    summary = [(key, result[key]) for key in ("pixAcc", "mIoU", "mAcc", "fwIoU", "mDice") if key in result]
    lines.append("-" * len(lines[0]))
    lines.append("  ".join(f"{key} {pct(float(value))}" for key, value in summary))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------------
# The accumulating metric
# ----------------------------------------------------------------------------------------------------------------------
class SegmentationMetric:
    """Accumulates a confusion matrix over batches and reports pixAcc / mIoU (PyTorch-Encoding contract) and more.

    Args:
        nclass: number of classes.
        ignore_index: target label of unscored pixels (default ``-1``, the PE convention).
        device: where the accumulated matrix lives (default: the device of the first predictions seen). Each update
            runs its ``bincount`` on the predictions' device and only the ``nclass x nclass`` result moves.

    Example:
        >>> metric = SegmentationMetric(nclass=21)
        >>> for image, target in loader:  # doctest: +SKIP
        ...     metric.update(model(image), target)     # logits, {"out": logits}, or a DataParallelModel list
        >>> pix_acc, miou = metric.get()                # doctest: +SKIP
        >>> print(format_table(metric.compute()))       # doctest: +SKIP
    """

    def __init__(self, nclass: int, ignore_index: int = -1, device: Optional[Union[str, torch.device]] = None):
        if int(nclass) < 1:
            raise ValueError(f"nclass must be >= 1, got {nclass}")
        self.nclass = int(nclass)
        self.ignore_index = int(ignore_index)
        self.device = torch.device(device) if device is not None else None
        self.confusion: Optional[Tensor] = None

    def reset(self) -> None:
        """Forget everything accumulated so far."""
        self.confusion = None

    def _accumulate(self, batch_confusion: Tensor) -> None:
        if self.confusion is None:
            device = self.device if self.device is not None else batch_confusion.device
            self.confusion = torch.zeros(self.nclass, self.nclass, dtype=torch.int64, device=device)
        self.confusion += batch_confusion.to(self.confusion.device)

    @torch.no_grad()
    def update(self, preds_or_logits: Output, target: Union[Tensor, Sequence[Tensor]]) -> None:
        """Add one batch.

        Args:
            preds_or_logits: logits ``BxCxHxW`` or labels ``BxHxW`` (single images ``CxHxW``/``HxW`` work too); a
                model output dict (its ``"out"`` entry is scored); or the ungathered per-replica list of
                ``encoding.parallel.DataParallelModel`` (each entry a tensor or dict on its own device).
            target: int labels ``BxHxW``; with a replica list either one target per replica or the whole batch,
                which is then split by the replicas' batch sizes and each chunk moved to its replica's device
                (the logits are never gathered onto one device).

        Raises:
            ValueError: shapes that do not match, or target values outside ``[0, nclass)`` other than
                ``ignore_index`` (the message names them).
        """
        if isinstance(preds_or_logits, (Tensor, Mapping)):
            self._accumulate(self._batch_confusion(main_output(preds_or_logits), target))
            return
        if not isinstance(preds_or_logits, (list, tuple)):
            raise TypeError(f"preds_or_logits must be a tensor, a dict or a list of per-replica outputs, got "
                            f"{type(preds_or_logits).__name__}")
        outputs = [main_output(out) for out in preds_or_logits]
        for out, tgt in zip(outputs, self._split_target(outputs, target)):
            self._accumulate(self._batch_confusion(out, tgt))

    def _batch_confusion(self, preds: Tensor, target: Tensor) -> Tensor:
        if not isinstance(target, Tensor):
            raise TypeError(f"target must be a tensor, got {type(target).__name__}")
        return confusion_matrix(preds, target, self.nclass, self.ignore_index)

    @staticmethod
    def _split_target(outputs: List[Tensor], target: Union[Tensor, Sequence[Tensor]]) -> List[Tensor]:
        if not outputs:
            raise ValueError("got an empty list of replica outputs")
        if isinstance(target, (list, tuple)):
            if len(target) != len(outputs):
                raise ValueError(f"got {len(outputs)} replica outputs but {len(target)} targets")
            return list(target)
        if not isinstance(target, Tensor):
            raise TypeError(f"target must be a tensor or a list of tensors, got {type(target).__name__}")
        sizes = [out.shape[0] for out in outputs]
        if sum(sizes) != target.shape[0]:
            raise ValueError(f"replica outputs hold {sizes} samples (total {sum(sizes)}) but the target has "
                             f"{target.shape[0]}")
        chunks = torch.split(target, sizes)
        return [chunk.to(out.device, non_blocking=True) for chunk, out in zip(chunks, outputs)]

    def reduce_from_all_processes(self) -> None:
        """Sum the confusion matrices of all processes (no-op unless ``torch.distributed`` is initialized).

        Every rank must call it (it is a collective); afterwards each rank holds the global matrix, so the scores
        equal those of a single-process evaluation over the union of the ranks' data.
        """
        if self.confusion is None:
            self.confusion = torch.zeros(self.nclass, self.nclass, dtype=torch.int64,
                                         device=self.device if self.device is not None else "cpu")
        self.confusion = reduce_across_processes(self.confusion)

    def _confusion_or_zeros(self) -> Tensor:
        if self.confusion is None:
            return torch.zeros(self.nclass, self.nclass, dtype=torch.int64)
        return self.confusion

    def compute(self) -> Dict[str, Any]:
        """All scores; see :func:`scores_from_confusion` for the keys."""
        return scores_from_confusion(self._confusion_or_zeros())

    def get(self) -> Tuple[float, float]:
        """``(pixAcc, mIoU)`` as in PyTorch-Encoding (mIoU is NaN-aware; both are ``NaN`` before any pixel)."""
        result = self.compute()
        return result["pixAcc"], result["mIoU"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(nclass={self.nclass}, ignore_index={self.ignore_index}, device={self.device})"


# ----------------------------------------------------------------------------------------------------------------------
# PyTorch-Encoding functional helpers
# ----------------------------------------------------------------------------------------------------------------------
def batch_pix_accuracy(output: Tensor, target: Tensor) -> Tuple[int, int]:
    """Correct and labeled pixel counts of a batch (PyTorch-Encoding helper).

    Args:
        output: logits ``BxCxHxW`` (or labels shaped like ``target``).
        target: int labels ``BxHxW``; negative values are unlabeled.

    Returns:
        ``(pixel_correct, pixel_labeled)`` as Python ints.
    """
    labels, _ = _to_labels(output, target, None)
    target = target.to(labels.device)
    labeled = target >= 0
    correct = (labels == target) & labeled
    return int(correct.sum()), int(labeled.sum())


def batch_intersection_union(output: Tensor, target: Tensor, nclass: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per-class intersection and union pixel counts of a batch (PyTorch-Encoding helper).

    Args:
        output: logits ``BxCxHxW`` (or labels shaped like ``target``).
        target: int labels ``BxHxW`` with ``-1`` for unlabeled pixels.
        nclass: number of classes.

    Returns:
        ``(area_inter, area_union)``: int64 numpy arrays of length ``nclass``. Unlike PE, a target value outside
        ``[0, nclass)`` other than ``-1`` raises ``ValueError`` instead of being silently dropped.
    """
    conf = confusion_matrix(output, target, nclass, ignore_index=-1).cpu()
    inter = conf.diagonal()
    union = conf.sum(dim=0) + conf.sum(dim=1) - inter
    return inter.numpy().astype(np.int64), union.numpy().astype(np.int64)


def pixel_accuracy(im_pred: Any, im_lab: Any) -> Tuple[int, int]:
    """Correct and labeled pixel counts of one image, CSAIL scene-parsing convention (label 0 = unlabeled).

    Args:
        im_pred: predicted labels (array-like).
        im_lab: ground-truth labels (array-like), 0 for unlabeled pixels.

    Returns:
        ``(pixel_correct, pixel_labeled)``.
    """
    pred, lab = np.asarray(im_pred), np.asarray(im_lab)
    labeled = lab > 0
    return int(np.sum((pred == lab) & labeled)), int(np.sum(labeled))


def intersection_and_union(im_pred: Any, im_lab: Any, num_class: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per-class intersection and union of one image, PyTorch-Encoding's CSAIL-style helper.

    Labels use 0 for unlabeled pixels and ``1 .. num_class - 1`` for the classes (``num_class`` counts the
    unlabeled value, as in PE). Predictions on unlabeled pixels are not counted; values outside
    ``[1, num_class - 1]`` are dropped, as PE's ``np.histogram`` did.

    Returns:
        ``(area_inter, area_union)``: int64 arrays of length ``num_class - 1`` (entry ``k`` is class ``k + 1``).
    """
    pred = np.asarray(im_pred).astype(np.int64).ravel()
    lab = np.asarray(im_lab).astype(np.int64).ravel()
    pred = pred * (lab > 0)
    bins = num_class - 1

    def area(values: np.ndarray) -> np.ndarray:
        values = values[(values >= 1) & (values <= bins)]
        return np.bincount(values - 1, minlength=bins)[:bins].astype(np.int64)

    area_inter = area(pred[pred == lab])
    area_union = area(pred) + area(lab) - area_inter
    return area_inter, area_union
