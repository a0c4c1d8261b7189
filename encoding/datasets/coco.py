"""COCO 2017 restricted to the 20 PASCAL VOC categories (21 classes with background), PyTorch-Encoding's ``coco``.

Masks are built once from ``instances_<split>2017.json`` with ``pycocotools`` (:func:`build_coco_masks`), following
PyTorch-Encoding: instances of the 20 VOC categories are painted in annotation order, a pixel keeps the first class
painted on it, everything else is background; only images with more than 1000 foreground pixels are kept. The result
(PNG masks + a list file) is then read like every other dataset, so training does not need ``pycocotools``.
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from .base import BaseDataset, DatasetError
from .pascal_voc import VOC_CLASSES, VOC_IGNORE_COLOR, VOC_PALETTE, list_split
from ..utils.files import atomic_write, staged_dir

__all__ = ["COCOSegmentation", "COCO_VOC_CATEGORY_IDS", "build_coco_masks"]

#: COCO category id of each VOC class, in VOC class order (0 = background).
COCO_VOC_CATEGORY_IDS = (0, 5, 2, 16, 9, 44, 6, 3, 17, 62, 21, 67, 18, 19, 4, 1, 64, 20, 63, 7, 72)
MIN_FOREGROUND_PIXELS = 1000
BASE_DIR = "coco"
MASK_DIR = "masks_voc"


def _import_coco_api():
    try:
        from pycocotools.coco import COCO
    except ImportError as e:
        raise ImportError("building the COCO (VOC classes) masks needs pycocotools: pip install pycocotools "
                          "(only once: the masks are then saved as PNGs and read without it)") from e
    return COCO


def build_coco_masks(coco_dir: str, split: str, *, min_pixels: int = MIN_FOREGROUND_PIXELS,
                     overwrite: bool = False, progress: bool = True) -> str:
    """Write VOC-class masks for one COCO split as ``<coco_dir>/masks_voc/<split>2017/<image>.png`` + a list file.

    Args:
        coco_dir: the COCO folder (holding ``annotations/instances_<split>2017.json``).
        split: ``train`` or ``val``.
        min_pixels: keep images with more foreground pixels than this.
        overwrite: rebuild even if the masks exist.
        progress: show a tqdm bar.

    Returns:
        The list file ``<coco_dir>/masks_voc/<split>2017.txt`` (image ids without extension).

    Raises:
        ImportError: pycocotools is not installed.
    """
    list_file = os.path.join(coco_dir, MASK_DIR, f"{split}2017.txt")
    mask_dir = os.path.join(coco_dir, MASK_DIR, f"{split}2017")
    if not overwrite and os.path.isfile(list_file) and os.path.isdir(mask_dir):
        return list_file
    ann_file = os.path.join(coco_dir, "annotations", f"instances_{split}2017.json")
    if not os.path.isfile(ann_file):
        raise DatasetError(ann_file, "COCO instance annotations are missing; run scripts/prepare_coco.py")
    coco = _import_coco_api()(ann_file)
    class_of = {cat: index for index, cat in enumerate(COCO_VOC_CATEGORY_IDS) if cat}
    kept = []
    with staged_dir(mask_dir, replace=True) as staging:
        for image_id in tqdm(sorted(coco.getImgIds()), desc=f"COCO {split} masks", disable=not progress):
            info = coco.loadImgs(image_id)[0]
            mask = np.zeros((int(info["height"]), int(info["width"])), dtype=np.uint8)
            for ann in coco.loadAnns(coco.getAnnIds(imgIds=image_id, iscrowd=None)):
                cls = class_of.get(ann["category_id"])
                if cls is not None:
                    region = np.asarray(coco.annToMask(ann)) > 0
                    mask[region & (mask == 0)] = cls
            if int(np.count_nonzero(mask)) > min_pixels:
                stem = os.path.splitext(info["file_name"])[0]
                Image.fromarray(mask).save(os.path.join(staging, stem + ".png"))
                kept.append(stem)
        if not kept:
            raise DatasetError(ann_file, f"no image has more than {min_pixels} pixels of VOC classes")
        atomic_write(list_file, "".join(stem + "\n" for stem in kept))
    return list_file


class COCOSegmentation(BaseDataset):
    """COCO 2017 with the 21 PASCAL VOC classes.

    Layout under the data root::

        coco/{train2017,val2017}/<image>.jpg
        coco/annotations/instances_{train,val}2017.json
        coco/masks_voc/{train2017,val2017}/<image>.png  +  coco/masks_voc/{train,val}2017.txt   (built on first use)

    If the masks are missing they are built on first use (needs ``pycocotools``; clear error otherwise).
    See :class:`BaseDataset` for the arguments.
    """

    NAME = "coco"
    NUM_CLASS = 21
    CLASSES = VOC_CLASSES
    PALETTE = VOC_PALETTE
    IGNORE_COLOR = VOC_IGNORE_COLOR
    SPLITS = ("train", "val")
    BASE_DIR = BASE_DIR

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        list_file = build_coco_masks(self.dataset_dir, self.split)
        return list_split(list_file, os.path.join(self.dataset_dir, f"{self.split}2017"), ".jpg",
                          os.path.join(self.dataset_dir, MASK_DIR, f"{self.split}2017"), ".png")


def __getattr__(name: str) -> Any:
    """``prepare_coco`` and ``RESOURCES``, moved to :mod:`encoding.datasets.prepare`, still resolve here."""
    from . import prepare

    return prepare.moved_attribute(__name__, name)
