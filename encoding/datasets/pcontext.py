"""PASCAL-Context, 59 classes (PyTorch-Encoding's ``pcontext``): VOC 2010 images + ``trainval_merged.json``.

The annotation JSON (PASCAL-in-Detail format) is converted once at prepare time, by
:func:`encoding.datasets.prepare.convert_context_annotations` (RLE masks decoded by ``pycocotools``, the ``prepare``
extra), into label PNGs in the 60-value form ``0 = background / other, 1..59 = classes``; the dataset then reads PNGs
like every other dataset and ignores 0 (``k`` becomes class ``k - 1``).
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from .base import BaseDataset, ShiftedLabels
from .layout import CONTEXT_CATEGORY_IDS, CONTEXT_DIR, CONTEXT_LIST_DIR, CONTEXT_MASK_DIR
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


class ContextSegmentation(ShiftedLabels, BaseDataset):
    """PASCAL-Context with the usual 59 classes (background / other ignored).

    Layout under the data root (``python -m encoding.datasets.prepare pcontext`` builds the last two from the JSON)::

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
    BASE_DIR = CONTEXT_DIR

    def _check_root(self) -> None:
        super()._check_root()
        self._prepared(os.path.join(self.dataset_dir, CONTEXT_MASK_DIR),
                       "the PASCAL-Context masks converted from trainval_merged.json")

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        base = self.dataset_dir
        return list_split(os.path.join(base, CONTEXT_LIST_DIR, self.split + ".txt"), os.path.join(base, "JPEGImages"),
                          ".jpg", os.path.join(base, CONTEXT_MASK_DIR), ".png")
