"""PASCAL VOC augmented with SBD (``VOCaug``): 21 classes, SBD's ``cls/*.mat`` converted once to label PNGs.

SBD ships its labels as MATLAB files (struct ``GTcls`` with field ``Segmentation``). They are read with SciPy
(the ``prepare`` extra) once, at prepare time (:func:`convert_sbd_masks`, called by
``python -m encoding.datasets.prepare pascal``), into ``cls_png/<id>.png``; training reads those PNGs like every other
dataset. If the PNGs are missing the dataset converts them on first use.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np
from PIL import Image
from tqdm.auto import tqdm

from .base import BaseDataset, DatasetError
from .pascal_voc import VOC_CLASSES, VOC_IGNORE_COLOR, VOC_PALETTE, list_split
from ..utils.files import staged_dir

__all__ = ["VOCAugSegmentation", "read_sbd_segmentation", "convert_sbd_masks"]

MAT_DIR, PNG_DIR = "cls", "cls_png"


def read_sbd_segmentation(path: str) -> np.ndarray:
    """The ``GTcls.Segmentation`` array (uint8, 255 = ignore) of one SBD ``cls/<id>.mat`` file.

    Raises:
        DatasetError: the file is missing, not a MATLAB file, truncated, or lacks ``GTcls.Segmentation``.
        ImportError: SciPy is not installed (``pip install "encoding[prepare]"``).
    """
    try:
        from scipy.io import loadmat
    except ImportError as e:
        raise ImportError("converting SBD's .mat labels needs SciPy: pip install scipy (or the 'prepare' extra); "
                          "only once: the labels are then saved as PNGs and read without it") from e
    try:
        content = loadmat(path, squeeze_me=True, struct_as_record=False)
    except FileNotFoundError:
        raise DatasetError(path, "mask file is missing") from None
    except (ValueError, OSError, TypeError) as e:
        raise DatasetError(path, f"cannot read .mat label ({e})") from e
    segmentation = getattr(content.get("GTcls"), "Segmentation", None)
    if segmentation is None:
        raise DatasetError(path, "expected a struct GTcls with a Segmentation field (SBD cls format)")
    return np.asarray(segmentation, dtype=np.uint8)


def convert_sbd_masks(base: str, *, overwrite: bool = False, progress: bool = True) -> str:
    """Convert every ``<base>/cls/<id>.mat`` into ``<base>/cls_png/<id>.png``, all or nothing.

    Args:
        base: the SBD dataset folder (``VOCaug/dataset``).
        overwrite: convert again even when the PNG folder exists.
        progress: show a progress bar.

    Returns:
        The PNG folder.
    """
    mat_dir, png_dir = os.path.join(base, MAT_DIR), os.path.join(base, PNG_DIR)
    if not overwrite and os.path.isdir(png_dir):
        return png_dir
    if not os.path.isdir(mat_dir):
        raise DatasetError(mat_dir, "SBD label folder is missing; is the archive the right one?")
    names = sorted(name for name in os.listdir(mat_dir) if name.endswith(".mat"))
    with staged_dir(png_dir, replace=True) as staging:
        for name in tqdm(names, desc="SBD labels to PNG", disable=not progress):
            label = read_sbd_segmentation(os.path.join(mat_dir, name))
            Image.fromarray(label).save(os.path.join(staging, name[:-len(".mat")] + ".png"))
    return png_dir


class VOCAugSegmentation(BaseDataset):
    """SBD / VOC-aug semantic segmentation.

    Layout under the data root (``python -m encoding.datasets.prepare pascal`` builds it)::

        VOCaug/dataset/img/<id>.jpg
        VOCaug/dataset/cls/<id>.mat          # struct GTcls with field Segmentation (0..20, 255 = ignore)
        VOCaug/dataset/cls_png/<id>.png      # the same labels, converted once (on first use if missing)
        VOCaug/dataset/{train,val,trainval}.txt

    See :class:`BaseDataset` for the arguments.
    """

    NAME = "pascal_aug"
    NUM_CLASS = 21
    CLASSES = VOC_CLASSES
    PALETTE = VOC_PALETTE
    IGNORE_COLOR = VOC_IGNORE_COLOR
    SPLITS = ("train", "val", "trainval")
    PREPARE_SCRIPT = "scripts/prepare_pascal.py"
    BASE_DIR = os.path.join("VOCaug", "dataset")

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        base = self.dataset_dir
        if os.path.isdir(os.path.join(base, MAT_DIR)):  # converted once (a no-op when the PNGs exist)
            convert_sbd_masks(base, progress=False)
        return list_split(os.path.join(base, self.split + ".txt"), os.path.join(base, "img"), ".jpg",
                          os.path.join(base, PNG_DIR), ".png")
