"""The charts of an evaluation (``test.py`` writes them beside ``metrics.json``): a row-normalised confusion matrix
and the per-class IoU sorted from the worst class.

* :func:`confusion_view` / :func:`plot_confusion`: rows are the true classes, each row divided by that class's
  pixels (so a cell is the share of the class's pixels predicted as the column's class); more than
  ``max_classes`` classes (ADE20K's 150) show the ``max_classes`` most confused ones, those with the most pixels
  on the off-diagonal of their row and column, the row shares still taken over all classes;
* :func:`iou_order` / :func:`plot_iou`: horizontal bars of each class's IoU, the worst at the top, the mIoU as a
  dashed line; classes absent from both the targets and the predictions (IoU undefined) are left out and counted
  in the title.

matplotlib is imported only when drawing (:func:`write_charts` says so in one line when it is missing); the PNGs are
written atomically.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Any, List, Mapping, Sequence, Tuple

import numpy as np
import torch

from ..utils.curves import save_figure

__all__ = ["CONFUSION_NAME", "IOU_NAME", "MAX_CLASSES", "confusion_view", "iou_order", "plot_confusion", "plot_iou",
           "write_charts", "remove_stale"]

#: The file names beside ``metrics.json``.
CONFUSION_NAME, IOU_NAME = "confusion.png", "iou.png"
#: The most classes a confusion-matrix picture shows (the most confused ones beyond that).
MAX_CLASSES = 30


def confusion_view(confusion: Any, max_classes: int = MAX_CLASSES) -> Tuple[List[int], np.ndarray]:
    """The class ids and the row-normalised matrix that :func:`plot_confusion` draws.

    Args:
        confusion: ``n x n`` counts, rows the true class, columns the predicted one (``SegmentationMetric``'s).
        max_classes: show at most this many classes: the ones with the most confused pixels (off-diagonal counts of
            their row plus their column), in class order.

    Returns:
        ``(ids, shares)``: ``shares[i, j]`` is the share of the pixels of class ``ids[i]`` predicted as ``ids[j]``
        (over all of that class's pixels; ``NaN`` for a class with no pixel in the targets).
    """
    counts = torch.as_tensor(confusion).detach().cpu().to(torch.float64).numpy()
    n = counts.shape[0]
    if counts.shape != (n, n):
        raise ValueError(f"confusion must be a square matrix, got shape {counts.shape}")
    ids = list(range(n))
    if n > max_classes:
        off = counts.sum(1) + counts.sum(0) - 2 * np.diag(counts)
        ids = sorted(int(i) for i in np.argsort(-off, kind="stable")[:max_classes])
    rows = counts.sum(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        shares = np.where(rows > 0, counts / np.maximum(rows, 1), np.nan)
    return ids, shares[np.ix_(ids, ids)]


def iou_order(iou: Any, class_names: Sequence[str]) -> List[Tuple[str, float]]:
    """``[(class name, IoU), ...]`` from the worst class to the best (the bars of :func:`plot_iou`, top to bottom);
    classes whose IoU is undefined (``NaN``: in neither the targets nor the predictions) are left out."""
    values = torch.as_tensor(iou).tolist()
    if len(values) != len(class_names):
        raise ValueError(f"{len(values)} IoU values for {len(class_names)} class names")
    scored = [(name, float(v)) for name, v in zip(class_names, values) if not math.isnan(v)]
    return sorted(scored, key=lambda item: item[1])


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    return plt


def _save(fig: Any, path: str) -> str:
    return save_figure(fig, path, dpi=80)


def plot_confusion(confusion: Any, class_names: Sequence[str], path: str, max_classes: int = MAX_CLASSES) -> str:
    """Draw :func:`confusion_view` as a PNG at ``path`` (class names on both axes; the shares in percent written in
    the cells up to 20 classes); returns ``path``."""
    ids, shares = confusion_view(confusion, max_classes)
    names = [class_names[i] for i in ids]
    k, plt = len(ids), _pyplot()
    side = max(4.0, 0.28 * k + 2.2)
    fig, ax = plt.subplots(figsize=(side + 1.0, side))
    image = ax.imshow(np.ma.masked_invalid(shares * 100), cmap="Blues", vmin=0, vmax=100)
    ax.set_xticks(range(k), names, rotation=90, fontsize=8)
    ax.set_yticks(range(k), names, fontsize=8)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    shown = f"the {k} most confused of {len(class_names)} classes" if k < len(class_names) else "every class"
    ax.set_title(f"% of each true class's pixels ({shown})", fontsize=9)
    if k <= 20:
        for (i, j), value in np.ndenumerate(shares):
            if not math.isnan(value) and value >= 0.005:
                ax.text(j, i, f"{100 * value:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if value > 0.5 else "black")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return _save(fig, path)


def plot_iou(result: Mapping[str, Any], class_names: Sequence[str], path: str) -> str:
    """Draw :func:`iou_order` of ``result["IoU"]`` as horizontal bars (the worst class at the top, the mIoU dashed)
    as a PNG at ``path``; returns ``path``."""
    bars = iou_order(result["IoU"], class_names)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, max(2.0, 0.2 * len(bars) + 1.0)))
    ax.barh(range(len(bars)), [v for _, v in bars], color="#4878b0")
    if len(bars) <= 40:
        for y, (_, value) in enumerate(bars):
            ax.text(min(value, 0.88) + 0.01, y, f"{value:.3f}", va="center", fontsize=7)
    ax.set_yticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.axvline(result["mIoU"], color="black", linestyle="--", linewidth=1)
    absent = len(class_names) - len(bars)
    ax.set_title(f"IoU per class, mIoU {result['mIoU']:.4f}" + (f" ({absent} absent classes left out)" if absent
                                                                  else ""), fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def write_charts(result: Mapping[str, Any], class_names: Sequence[str], out_dir: str) -> List[str]:
    """:func:`plot_confusion` and :func:`plot_iou` of ``result`` into ``out_dir`` (:data:`CONFUSION_NAME`,
    :data:`IOU_NAME`); nothing, and one line on stderr, when matplotlib is not installed. Returns the paths."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no confusion / IoU chart (pip install matplotlib)", file=sys.stderr)
        return []
    return [plot_confusion(result["confusion"], class_names, os.path.join(out_dir, CONFUSION_NAME)),
            plot_iou(result, class_names, os.path.join(out_dir, IOU_NAME))]


def remove_stale(out_dir: str, written: Sequence[str], names: Sequence[str]) -> List[str]:
    """Remove the files ``names`` in ``out_dir`` that this evaluation did not write (``written``): the pictures of an
    earlier evaluation (a gallery of another mode, charts made before matplotlib went) would sit beside new scores
    as if they were theirs. Returns the removed paths."""
    kept = {os.path.basename(path) for path in written}
    removed = [os.path.join(out_dir, name) for name in names if name not in kept]
    removed = [path for path in removed if os.path.isfile(path)]
    for path in removed:
        os.remove(path)
    return removed
