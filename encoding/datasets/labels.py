"""Label tables: how a dataset's raw mask values (``0..255``) become class indices, :data:`LABEL_IGNORE` or
:data:`INVALID_LABEL` (a value that is neither: a mask holding one is refused or ignored, as the dataset says).
Read by :meth:`encoding.datasets.base.BaseDataset.label_table`.
"""
from __future__ import annotations

from typing import Dict, Sequence

import numpy as np

from .transforms import LABEL_IGNORE

__all__ = ["INVALID_LABEL", "identity_table", "shifted_table", "mapped_table"]

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
