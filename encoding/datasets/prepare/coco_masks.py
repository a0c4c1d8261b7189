"""COCO 2017's instances converted once into masks of the 20 PASCAL VOC categories (PyTorch-Encoding's ``coco``).

:func:`build_coco_masks` follows PyTorch-Encoding: instances of the 20 VOC categories are painted in annotation order,
a pixel keeps the first class painted on it, everything else is background; only images with more than 1000
foreground pixels are kept. The result (PNG masks + a list file per split, under ``coco/masks_voc``) is read by
:class:`~encoding.datasets.COCOSegmentation` like every other dataset, so training does not need ``pycocotools``
(the ``prepare`` extra, used only here).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np
from PIL import Image
from ...errors import MissingDependency
from ...utils.progress import progress_bar as tqdm

from ..layout import COCO_MASK_DIR, COCO_VOC_CATEGORY_IDS, DatasetError
from .annotations import check_rle_size, converted, image_shape, mask_stem, staged_conversion

__all__ = ["build_coco_masks", "MIN_FOREGROUND_PIXELS"]

#: An image is kept when more of its pixels than this belong to a VOC class.
MIN_FOREGROUND_PIXELS = 1000


def _import_coco_api():
    try:
        from pycocotools.coco import COCO
    except ImportError as e:
        raise MissingDependency("building the COCO (VOC classes) masks needs pycocotools: pip install pycocotools "
                                "(only once: the masks are then saved as PNGs and read without it)") from e
    return COCO


def _load_coco(ann_file: str) -> Any:
    """``pycocotools.coco.COCO`` of ``ann_file``; a file that is not COCO instances JSON is a one-line error."""
    coco_api = _import_coco_api()
    try:
        return coco_api(ann_file)
    except (ValueError, KeyError, TypeError, AssertionError, AttributeError) as e:  # pycocotools asserts a dict
        raise DatasetError(ann_file, f"not a COCO instances annotation file ({e!r})") from e


def _voc_mask(coco: Any, info: Mapping[str, Any], class_of: Mapping[int, int], ann_file: str) -> np.ndarray:
    """One image's mask of VOC classes: its instances painted in order, a pixel keeping the first class painted."""
    mask = np.zeros(image_shape(info, ann_file), dtype=np.uint8)
    try:
        for ann in coco.loadAnns(coco.getAnnIds(imgIds=info["id"], iscrowd=None)):
            cls = class_of.get(ann["category_id"])
            if cls is not None:
                check_rle_size(ann, mask.shape)
                region = np.asarray(coco.annToMask(ann)) > 0
                mask[region & (mask == 0)] = cls
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise DatasetError(ann_file, f"bad annotation for image {info.get('file_name')!r} ({e!r})") from e
    return mask


def build_coco_masks(coco_dir: str, split: str, *, min_pixels: int = MIN_FOREGROUND_PIXELS,
                     overwrite: bool = False, progress: bool = True) -> str:
    """Write VOC-class masks for one COCO split as ``<coco_dir>/masks_voc/<split>2017/<image>.png`` + a list file.

    Args:
        coco_dir: the COCO folder (holding ``annotations/instances_<split>2017.json``).
        split: ``train`` or ``val``.
        min_pixels: keep images with more foreground pixels than this.
        overwrite: rebuild even if the masks exist (masks and list are one unit,
            :func:`~.annotations.staged_conversion`: an interrupted build, which leaves no marker, is redone anyway).
        progress: show a tqdm bar.

    Returns:
        The list file ``<coco_dir>/masks_voc/<split>2017.txt`` (image ids without extension).

    Raises:
        ImportError: pycocotools is not installed.
        DatasetError: naming the annotation file: missing, not COCO instances JSON, an image whose ``file_name`` is
            not a plain file name or whose size is not usable (:mod:`.annotations`), or an unreadable annotation.
    """
    list_file = os.path.join(coco_dir, COCO_MASK_DIR, f"{split}2017.txt")
    mask_dir = os.path.join(coco_dir, COCO_MASK_DIR, f"{split}2017")
    if not overwrite and converted(mask_dir, [list_file]):
        return list_file
    ann_file = os.path.join(coco_dir, "annotations", f"instances_{split}2017.json")
    if not os.path.isfile(ann_file):
        raise DatasetError(ann_file, "COCO instance annotations are missing; "
                                     "run python -m encoding.datasets.prepare coco")
    coco = _load_coco(ann_file)
    class_of = {cat: index for index, cat in enumerate(COCO_VOC_CATEGORY_IDS) if cat}
    kept = []
    with staged_conversion(mask_dir) as (staging, lists):
        for image_id in tqdm(sorted(coco.getImgIds()), desc=f"COCO {split} masks", disable=not progress):
            info = coco.loadImgs(image_id)[0]
            stem = mask_stem(info.get("file_name"), ann_file)
            mask = _voc_mask(coco, info, class_of, ann_file)
            if int(np.count_nonzero(mask)) > min_pixels:
                Image.fromarray(mask).save(os.path.join(staging, stem + ".png"))
                kept.append(stem)
        if not kept:
            raise DatasetError(ann_file, f"no image has more than {min_pixels} pixels of VOC classes")
        lists[list_file] = "".join(stem + "\n" for stem in kept)
    return list_file
