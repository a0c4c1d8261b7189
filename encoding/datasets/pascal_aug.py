"""PASCAL VOC augmented with SBD (``VOCaug``): 21 classes read from the SBD ``cls/*.mat`` files."""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np

from .base import BaseDataset, DatasetError
from .matfile import MatFileError, load_mat
from .pascal_voc import VOC_CLASSES, VOC_IGNORE_COLOR, VOC_PALETTE, list_split

__all__ = ["VOCAugSegmentation"]


class VOCAugSegmentation(BaseDataset):
    """SBD / VOC-aug semantic segmentation.

    Layout under the data root (``scripts/prepare_pascal.py`` builds it)::

        VOCaug/dataset/img/<id>.jpg
        VOCaug/dataset/cls/<id>.mat          # struct GTcls with field Segmentation (0..20, 255 = ignore)
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
        return list_split(os.path.join(base, self.split + ".txt"), os.path.join(base, "img"), ".jpg",
                          os.path.join(base, "cls"), ".mat")

    def _read_label(self, path: str) -> np.ndarray:
        try:
            content = load_mat(path)
        except FileNotFoundError:
            raise DatasetError(path, "mask file is missing") from None
        except (MatFileError, OSError) as e:
            raise DatasetError(path, f"cannot read .mat label ({e})") from e
        gt = content.get("GTcls")
        if not isinstance(gt, dict) or "Segmentation" not in gt:
            raise DatasetError(path, "expected a struct GTcls with a Segmentation field (SBD cls format)")
        return np.asarray(gt["Segmentation"])
