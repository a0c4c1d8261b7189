"""Cityscapes fine annotations: 19 evaluation classes from ``*_gtFine_labelIds.png`` via the official id -> trainId."""
from __future__ import annotations

import glob
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from .base import BaseDataset, DatasetError, mapped_table
from .layout import CITYS_DIR

__all__ = ["CitySegmentation", "CITYSCAPES_CLASSES", "CITYSCAPES_PALETTE", "CITYSCAPES_ID_TO_TRAIN_ID"]

CITYSCAPES_CLASSES = (
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign", "vegetation", "terrain",
    "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle", "bicycle",
)
#: The official Cityscapes colours of the 19 train ids.
CITYSCAPES_PALETTE = (
    (128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156), (190, 153, 153), (153, 153, 153),
    (250, 170, 30), (220, 220, 0), (107, 142, 35), (152, 251, 152), (70, 130, 180), (220, 20, 60), (255, 0, 0),
    (0, 0, 142), (0, 0, 70), (0, 60, 100), (0, 80, 100), (0, 0, 230), (119, 11, 32),
)
#: Official ``labelId -> trainId`` of the 19 evaluated classes; every other id (0..33) is ignored.
CITYSCAPES_ID_TO_TRAIN_ID: Dict[int, int] = {
    7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10, 24: 11, 25: 12, 26: 13, 27: 14,
    28: 15, 31: 16, 32: 17, 33: 18,
}
MAX_LABEL_ID = 33


class CitySegmentation(BaseDataset):
    """Cityscapes semantic segmentation (fine annotations, 19 classes).

    Layout under the data root::

        citys/leftImg8bit/<split>/<city>/<name>_leftImg8bit.png
        citys/gtFine/<split>/<city>/<name>_gtFine_labelIds.png

    Splits: ``train``, ``val``, ``trainval``, ``test`` (images only). Default sizes follow the PyTorch-Encoding
    Cityscapes recipe (base 1024, crop 768). See :class:`BaseDataset` for the arguments.
    """

    NAME = "citys"
    NUM_CLASS = 19
    CLASSES = CITYSCAPES_CLASSES
    PALETTE = CITYSCAPES_PALETTE
    IGNORE_COLOR = (0, 0, 0)  # Cityscapes' "unlabeled" colour
    SPLITS = ("train", "val", "trainval", "test")
    BASE_SIZE = 1024
    CROP_SIZE = 768
    BASE_DIR = CITYS_DIR

    @classmethod
    def label_table(cls) -> np.ndarray:
        return mapped_table(CITYSCAPES_ID_TO_TRAIN_ID, MAX_LABEL_ID)

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        images: List[str] = []
        for split in (("train", "val") if self.split == "trainval" else (self.split,)):
            image_dir = os.path.join(self.dataset_dir, "leftImg8bit", split)
            if not os.path.isdir(image_dir):
                raise DatasetError(image_dir, "image folder is missing")
            found = sorted(glob.glob(os.path.join(image_dir, "*", "*_leftImg8bit.png")))
            if not found:
                raise DatasetError(image_dir, "no <city>/*_leftImg8bit.png image found")
            images += found
        if self.split == "test":
            return images, None
        masks = []
        for path in images:
            rel = os.path.relpath(path, os.path.join(self.dataset_dir, "leftImg8bit"))
            masks.append(os.path.join(self.dataset_dir, "gtFine",
                                      rel[:-len("_leftImg8bit.png")] + "_gtFine_labelIds.png"))
        return images, masks
