"""PASCAL-Context, 59 classes (PyTorch-Encoding's ``pcontext``): VOC 2010 images + ``trainval_merged.json``.

The annotation JSON (PASCAL-in-Detail format) is converted once at prepare time, by
:func:`encoding.datasets.prepare.convert_context_annotations` (RLE masks decoded by ``pycocotools``, the ``prepare``
extra), into label PNGs in the 60-value form ``0 = background / other, 1..59 = classes``; the dataset then reads PNGs
like every other dataset and ignores 0 (``k`` becomes class ``k - 1``).
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

from .base import BaseDataset, DatasetError, ShiftedLabels
from .pascal_voc import list_split
from ..utils.palette import voc_palette

__all__ = ["ContextSegmentation", "CONTEXT_CLASSES", "CONTEXT_CATEGORY_IDS"]

CONTEXT_CLASSES = (
    "aeroplane", "bag", "bed", "bedclothes", "bench", "bicycle", "bird", "boat", "book", "bottle", "building", "bus",
    "cabinet", "car", "cat", "ceiling", "chair", "cloth", "computer", "cow", "cup", "curtain", "dog", "door", "fence",
    "floor", "flower", "food", "grass", "ground", "horse", "keyboard", "light", "motorbike", "mountain", "mouse",
    "person", "plate", "platform", "pottedplant", "road", "rock", "sheep", "shelves", "sidewalk", "sign", "sky",
    "snow", "sofa", "table", "track", "train", "tree", "truck", "tvmonitor", "wall", "water", "window", "wood",
)
#: PASCAL-Context (459-label) category ids of the 59 classes, in class order (ascending id).
CONTEXT_CATEGORY_IDS = (
    2, 9, 18, 19, 22, 23, 25, 31, 33, 34, 44, 45, 46, 59, 65, 68, 72, 80, 85, 98, 104, 105, 113, 115, 144, 158, 159,
    162, 187, 189, 207, 220, 232, 258, 259, 260, 284, 295, 296, 308, 324, 326, 347, 349, 354, 355, 360, 366, 368,
    397, 415, 416, 420, 424, 427, 440, 445, 454, 458,
)

BASE_DIR = os.path.join("VOCdevkit", "VOC2010")
MASK_DIR = "SegmentationClassContext"
LIST_DIR = os.path.join("ImageSets", "SegmentationContext")


class ContextSegmentation(ShiftedLabels, BaseDataset):
    """PASCAL-Context with the usual 59 classes (background / other ignored).

    Layout under the data root (``scripts/prepare_pcontext.py`` builds the last two from the JSON)::

        VOCdevkit/VOC2010/JPEGImages/<id>.jpg
        VOCdevkit/VOC2010/SegmentationClassContext/<id>.png          # 0 = other, 1..59 = classes
        VOCdevkit/VOC2010/ImageSets/SegmentationContext/{train,val}.txt

    See :class:`BaseDataset` for the arguments.
    """

    NAME = "pcontext"
    NUM_CLASS = 59
    CLASSES = CONTEXT_CLASSES
    PALETTE = voc_palette()[:len(CONTEXT_CLASSES)]  # the VOC colour map, as in PyTorch-Encoding
    IGNORE_COLOR = voc_palette()[255]
    SPLITS = ("train", "val")
    BASE_DIR = BASE_DIR

    def _check_root(self) -> None:
        super()._check_root()
        if not os.path.isdir(os.path.join(self.dataset_dir, MASK_DIR)):
            raise DatasetError(os.path.join(self.dataset_dir, MASK_DIR),
                               "converted PASCAL-Context masks not found; run scripts/prepare_pcontext.py "
                               "(it converts trainval_merged.json)")

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        base = self.dataset_dir
        return list_split(os.path.join(base, LIST_DIR, self.split + ".txt"), os.path.join(base, "JPEGImages"),
                          ".jpg", os.path.join(base, MASK_DIR), ".png")


def __getattr__(name: str) -> Any:
    """``prepare_pcontext``, ``RESOURCES``, ``decode_rle`` and ``convert_context_annotations``, moved to
    :mod:`encoding.datasets.prepare`, still resolve here."""
    from . import prepare

    return prepare.moved_attribute(__name__, name)
