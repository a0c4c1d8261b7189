"""Label tables: how a dataset's raw mask values (``0..255``) become class indices, :data:`LABEL_IGNORE` or
:data:`INVALID_LABEL` (a value that is neither: a mask holding one is refused or ignored, as the dataset says).
Read by :meth:`encoding.datasets.base.BaseDataset.label_table`; :func:`table_classes` maps an index mask through one.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from .layout import DatasetError
from .transforms import LABEL_IGNORE

__all__ = ["INVALID_LABEL", "identity_table", "shifted_table", "mapped_table", "table_classes", "ShiftedLabels"]

#: Internal: marks raw label values that are neither a class nor ignore in a label table (never in a returned mask).
INVALID_LABEL = 254


def identity_table(nclass: int, ignore: Sequence[int] = (255,)) -> np.ndarray:
    """Label table for masks that already hold class indices ``0..nclass-1`` plus ignore values."""
    table = np.full(256, INVALID_LABEL, dtype=np.uint8)
    table[:nclass] = np.arange(nclass)
    table[list(ignore)] = LABEL_IGNORE
    return table


def shifted_table(nclass: int) -> np.ndarray:
    """Label table for masks where 0 means "other" (ignored) and ``1..nclass`` are the classes (ADE20K, PContext)."""
    table = np.full(256, INVALID_LABEL, dtype=np.uint8)
    table[0] = LABEL_IGNORE
    table[1:nclass + 1] = np.arange(nclass)
    return table


def mapped_table(mapping: Dict[int, int], max_raw: int, ignore: Sequence[int] = (255,)) -> np.ndarray:
    """Label table from an explicit ``raw -> class`` mapping; other raw values up to ``max_raw`` are ignored."""
    table = np.full(256, INVALID_LABEL, dtype=np.uint8)
    table[:max_raw + 1] = LABEL_IGNORE
    table[list(ignore)] = LABEL_IGNORE
    for raw, cls in mapping.items():
        table[raw] = cls
    return table


def table_classes(raw: np.ndarray, table: np.ndarray, nclass: int, path: str,
                  unknown: int = INVALID_LABEL) -> np.ndarray:
    """An index mask's raw values as checked class indices (``uint8``, :data:`LABEL_IGNORE` = ignore).

    Args:
        raw: the ``H x W`` values of the mask file ``path`` (uint8, or 16/32-bit).
        table: its dataset's 256-entry label table.
        nclass: the dataset's class count (for the message).
        path: the mask file (named by the error).
        unknown: what a value beyond ``0..255`` (a 16-bit mask's 300) maps to: :data:`INVALID_LABEL` (refused) or
            :data:`LABEL_IGNORE` (a dataset that ignores values of no class).

    Raises:
        DatasetError: the mask is not 2-D, or holds values that are neither a class nor ignore.
    """
    if raw.ndim != 2:
        raise DatasetError(path, f"mask has shape {raw.shape}; expected a 2-D label image")
    wide = raw.dtype != np.uint8
    mapped = table.take(raw.clip(0, 255).astype(np.uint8) if wide else raw)  # take: faster than table[raw]
    if wide:
        mapped[(raw < 0) | (raw > 255)] = unknown
    invalid = mapped == INVALID_LABEL
    if invalid.any():
        raise DatasetError(path, f"label values {np.unique(raw[invalid])[:10].tolist()} are outside the {nclass} "
                                 "classes (and not ignore)")
    return mapped


class ShiftedLabels:
    """Mixin for datasets whose raw label 0 means "other" (ignored) and class ``k`` is stored as ``k + 1``
    (ADE20K, PASCAL-Context): the label table shifts by one and predictions are written back with offset 1."""

    @property
    def pred_offset(self) -> int:
        return 1

    @classmethod
    def label_table(cls) -> np.ndarray:
        return shifted_table(cls.NUM_CLASS)
