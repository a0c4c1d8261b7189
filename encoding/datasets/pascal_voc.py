"""PASCAL VOC 2012 segmentation (21 classes, 255 = ignore)."""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from .base import BaseDataset, read_split_file
from .layout import VOC_DIR
from ..utils.palette import voc_palette

__all__ = ["VOCSegmentation", "VOC_CLASSES", "VOC_PALETTE", "VOC_IGNORE_COLOR", "list_split"]

VOC_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)
#: The PASCAL VOC colour map of the 21 classes; ignored pixels take VOC's own "void" colour (entry 255).
VOC_PALETTE = voc_palette()[:len(VOC_CLASSES)]
VOC_IGNORE_COLOR = voc_palette()[255]


def list_split(split_file: str, image_dir: str, image_ext: str, mask_dir: Optional[str],
               mask_ext: str) -> Tuple[List[str], Optional[List[str]]]:
    """Image and mask paths for the ids of a split file (``mask_dir=None``: images only)."""
    ids = read_split_file(split_file)
    images = [os.path.join(image_dir, i + image_ext) for i in ids]
    masks = None if mask_dir is None else [os.path.join(mask_dir, i + mask_ext) for i in ids]
    return images, masks


class VOCSegmentation(BaseDataset):
    """PASCAL VOC 2012 semantic segmentation.

    Layout under the data root::

        VOCdevkit/VOC2012/JPEGImages/<id>.jpg
        VOCdevkit/VOC2012/SegmentationClass/<id>.png        # palette PNG, 0..20, 255 = boundary / ignore
        VOCdevkit/VOC2012/ImageSets/Segmentation/<split>.txt

    Splits: ``train``, ``val``, ``trainval``, ``test`` (images only). See :class:`BaseDataset` for the arguments.
    """

    NAME = "pascal_voc"
    NUM_CLASS = 21
    CLASSES = VOC_CLASSES
    PALETTE = VOC_PALETTE
    IGNORE_COLOR = VOC_IGNORE_COLOR
    SPLITS = ("train", "val", "trainval", "test")
    PREPARE_SCRIPT = "scripts/prepare_pascal.py"
    BASE_DIR = VOC_DIR

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        base = self.dataset_dir
        return list_split(os.path.join(base, "ImageSets", "Segmentation", self.split + ".txt"),
                          os.path.join(base, "JPEGImages"), ".jpg",
                          None if self.split == "test" else os.path.join(base, "SegmentationClass"), ".png")
