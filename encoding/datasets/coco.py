"""COCO 2017 restricted to the 20 PASCAL VOC categories (21 classes with background), PyTorch-Encoding's ``coco``.

The masks are built once, at prepare time, from ``instances_<split>2017.json`` (``python -m encoding.datasets.prepare
coco``, :func:`~encoding.datasets.prepare.coco_masks.build_coco_masks`); this dataset reads the PNG masks and list
files like every other dataset, so training does not need ``pycocotools``.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from .base import BaseDataset
from .layout import COCO_DIR, COCO_MASK_DIR, COCO_VOC_CATEGORY_IDS
from .pascal_voc import VOC_CLASSES, VOC_IGNORE_COLOR, VOC_PALETTE, list_split

__all__ = ["COCOSegmentation", "COCO_VOC_CATEGORY_IDS"]


class COCOSegmentation(BaseDataset):
    """COCO 2017 with the 21 PASCAL VOC classes.

    Layout under the data root::

        coco/{train2017,val2017}/<image>.jpg
        coco/annotations/instances_{train,val}2017.json
        coco/masks_voc/{train2017,val2017}/<image>.png  +  coco/masks_voc/{train,val}2017.txt   (built at prepare time)

    Missing masks are a :class:`~encoding.datasets.DatasetError` naming the list file and the prepare command.
    See :class:`BaseDataset` for the arguments.
    """

    NAME = "coco"
    NUM_CLASS = 21
    CLASSES = VOC_CLASSES
    PALETTE = VOC_PALETTE
    IGNORE_COLOR = VOC_IGNORE_COLOR
    SPLITS = ("train", "val")
    BASE_DIR = COCO_DIR

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        list_file = self._prepared(os.path.join(self.dataset_dir, COCO_MASK_DIR, f"{self.split}2017.txt"),
                                   "the COCO (VOC classes) mask list")
        return list_split(list_file, os.path.join(self.dataset_dir, f"{self.split}2017"), ".jpg",
                          os.path.join(self.dataset_dir, COCO_MASK_DIR, f"{self.split}2017"), ".png")
