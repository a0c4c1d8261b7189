"""PyTorch-Encoding's functional metric helpers, on :func:`~encoding.utils.metrics.confusion_matrix`.

``batch_pix_accuracy`` / ``batch_intersection_union`` use PE's label convention (``-1`` = unlabeled);
``pixel_accuracy`` / ``intersection_and_union`` the CSAIL scene-parsing one (``0`` = unlabeled). Each is
declared in ``encoding.utils`` and ``encoding.utils.metrics`` beside its definition, and listed in the latter's
``__all__`` as PE's was (``from encoding.utils.metrics import *``). PE's classification ``accuracy`` and its
``get_pixacc_miou`` (accumulated counts -> ``(pixAcc, mIoU)``) are declared in the same two modules, by name only.
"""
from __future__ import annotations

import warnings
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from ..utils.metrics import confusion_matrix, to_labels
from .declare import old_name

__all__ = ["batch_pix_accuracy", "batch_intersection_union", "pixel_accuracy", "intersection_and_union", "accuracy",
           "get_pixacc_miou"]

_NEW = "encoding.utils.SegmentationMetric (update(output, target), then get())"
#: PyTorch-Encoding's ``encoding.utils.metrics.__all__`` listed them: ``from encoding.utils.metrics import *`` (its
#: tests' import) brings them.
_STAR = ("encoding.utils.metrics",)


@old_name("encoding.utils", "encoding.utils.metrics", new=_NEW, star=_STAR)
def batch_pix_accuracy(output: Tensor, target: Tensor, nclass: Optional[int] = None) -> Tuple[int, int]:
    """Correct and labeled pixel counts of a batch (PyTorch-Encoding helper).

    Args:
        output: logits ``BxCxHxW`` (or labels shaped like ``target``).
        target: int labels ``BxHxW``; ``-1`` marks unlabeled pixels.
        nclass: the number of classes (not PE's): checks labels as logits are checked. Logits give it themselves.

    Returns:
        ``(pixel_correct, pixel_labeled)`` as Python ints. Unlike PE, a target value outside ``[0, C)`` other than
        ``-1`` raises ``ValueError`` (as :func:`batch_intersection_union`) instead of being counted as a labeled,
        wrong pixel (``255``) or as unlabeled (``-5``). With labels and no ``nclass`` the classes are unknown: a
        negative value other than ``-1`` is refused, and a ``255`` (VOC's and Cityscapes' unlabeled value) is
        counted as labeled with a warning (map it to ``-1``, or pass ``nclass``).
    """
    labels, from_logits = to_labels(output, target)
    if from_logits or nclass is not None:
        conf = confusion_matrix(labels, target, nclass or output.shape[0 if target.dim() <= 2 else 1],
                                ignore_index=-1)
        return int(conf.diagonal().sum()), int(conf.sum())
    target = target.to(labels.device)
    if bool((target < -1).any()):
        raise ValueError(f"target values must be class indices or -1 (unlabeled), got {int(target.min())}")
    if bool((target == 255).any()):
        warnings.warn("batch_pix_accuracy: the target holds 255 (VOC's and Cityscapes' unlabeled value), counted as "
                      "a labeled pixel of class 255: map it to -1, or pass nclass to refuse values outside the "
                      "classes", stacklevel=2)
    labeled = target >= 0
    correct = (labels == target) & labeled
    return int(correct.sum()), int(labeled.sum())


@old_name("encoding.utils", "encoding.utils.metrics", new=_NEW, star=_STAR)
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


@old_name("encoding.utils", "encoding.utils.metrics", new=_NEW, star=_STAR)
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


@old_name("encoding.utils", "encoding.utils.metrics", new=_NEW, star=_STAR)
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


@old_name("encoding.utils", "encoding.utils.metrics")
def accuracy(output: Tensor, target: Tensor, topk: Sequence[int] = (1,)) -> List[Tensor]:
    """Top-k classification accuracy of a batch, in percent (PyTorch-Encoding's ``accuracy``).

    Args:
        output: scores ``B x C``.
        target: class indices ``B``.
        topk: the ``k`` values, each at most ``C``.

    Returns:
        One 1-element float tensor per ``k`` (on ``output``'s device): ``100 * (# samples whose target is among
        their k highest scores) / B``. Ties are broken as ``torch.topk`` breaks them.
    """
    with torch.no_grad():
        _, best = output.topk(max(topk), dim=1, largest=True, sorted=True)
        hits = best.eq(target.view(-1, 1).to(best.device))
        return [hits[:, :k].any(dim=1).float().sum(0, keepdim=True) * (100.0 / target.size(0)) for k in topk]


def _float64(value: Any) -> np.ndarray:
    """A count (int, array, tensor on any device) as a float64 array."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().double()
    return np.asarray(value, dtype=np.float64)


@old_name("encoding.utils", "encoding.utils.metrics", new=_NEW)
def get_pixacc_miou(total_correct: Any, total_label: Any, total_inter: Any,
                    total_union: Any) -> Tuple[np.float64, np.float64]:
    """``(pixAcc, mIoU)`` of accumulated counts (PyTorch-Encoding helper, e.g. after ``torch_dist_sum``).

    Args:
        total_correct, total_label: correctly classified and labeled pixel counts (numbers or 1-element arrays /
            tensors).
        total_inter, total_union: per-class intersection and union counts (arrays or tensors of length ``nclass``).

    Returns:
        ``pixAcc = correct / (eps + labeled)`` and ``mIoU = mean_k inter_k / (eps + union_k)`` over *every* class
        (``eps = np.spacing(1)``, as PE: a class absent from prediction and target counts as IoU 0, unlike
        ``SegmentationMetric.get()``'s NaN-aware mean), as float64 scalars.
    """
    eps = np.spacing(1)
    pix_acc = _float64(total_correct) / (eps + _float64(total_label))
    iou = _float64(total_inter) / (eps + _float64(total_union))
    return np.float64(pix_acc.item()), np.float64(iou.mean())
