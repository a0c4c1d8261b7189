"""Text rendering of segmentation scores: the per-class IoU / accuracy table (computing is in :mod:`.metrics`)."""
from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple

__all__ = ["format_table", "scores_to_json"]

_SUMMARY_KEYS = ("pixAcc", "mIoU", "mAcc", "fwIoU", "mDice", "fgIoU", "fgDice", "precision", "recall")  # fg: binary


def _percent(value: float, digits: int) -> str:
    """``value`` in percent with ``digits`` decimals, ``-`` when undefined (``NaN``)."""
    return "-" if math.isnan(value) else f"{100.0 * value:.{digits}f}"


def _aligned(rows: List[Tuple[str, str, str]]) -> List[str]:
    """Left-aligned first column, right-aligned numbers."""
    width = max(len(row[0]) for row in rows)
    num = max(max(len(row[1]), len(row[2])) for row in rows)
    return [f"{a:<{width}}  {b:>{num}}  {c:>{num}}" for a, b, c in rows]


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
    names = _names(class_names, len(iou))
    rows = [("class", "IoU", "Acc")] + [(name, _percent(i, digits), _percent(a, digits))
                                         for name, i, a in zip(names, iou, acc)]
    lines = _aligned(rows)
    rule = "-" * len(lines[0])
    summary = "  ".join(f"{key} {_percent(float(result[key]), digits)}" for key in _SUMMARY_KEYS if key in result)
    return "\n".join([lines[0], rule] + lines[1:] + [rule, summary])


def _number(value: Any) -> Optional[float]:
    value = float(value)
    return None if math.isnan(value) else value


def _names(class_names: Optional[Sequence[str]], count: int) -> List[str]:
    """One name per class (default: the class indices); refused when there are not ``count`` of them (the rows or
    keys would be cut to the shorter list)."""
    names = [str(i) for i in range(count)] if class_names is None else [str(name) for name in class_names]
    if len(names) != count:
        raise ValueError(f"class_names has {len(names)} entries but the result has {count} classes")
    return names


def scores_to_json(result: Mapping[str, Any], class_names: Optional[Sequence[str]] = None) -> dict:
    """The scores of :meth:`SegmentationMetric.compute` as plain JSON values (``NaN`` -> ``null``).

    Returns:
        ``{"pixAcc", "mIoU", "mAcc", "fwIoU", "mDice", "per_class": {name: {"IoU", "Acc"}}}``.
    """
    iou, acc = result["IoU"].tolist(), result["Acc"].tolist()
    names = _names(class_names, len(iou))
    summary = {key: _number(result[key]) for key in _SUMMARY_KEYS if key in result}
    return {**summary, "per_class": {name: {"IoU": _number(i), "Acc": _number(a)}
                                     for name, i, a in zip(names, iou, acc)}}
