"""PASCAL VOC augmented with SBD (``VOCaug``): 21 classes, read from the label PNGs written at prepare time.

SBD's ``cls/*.mat`` labels are converted once by ``python -m encoding.datasets.prepare pascal``
(:func:`~encoding.datasets.prepare.sbd.convert_sbd_masks`) into ``cls_png/<id>.png``; this dataset reads those PNGs.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from .base import BaseDataset
from .layout import SBD_DIR, SBD_PNG_DIR
from .pascal_voc import VOC_CLASSES, VOC_IGNORE_COLOR, VOC_PALETTE, list_split

__all__ = ["VOCAugSegmentation"]


class VOCAugSegmentation(BaseDataset):
    """SBD / VOC-aug semantic segmentation.

    Layout under the data root (``python -m encoding.datasets.prepare pascal`` builds it)::

        VOCaug/dataset/img/<id>.jpg
        VOCaug/dataset/cls/<id>.mat          # struct GTcls with field Segmentation (0..20, 255 = ignore), as published
        VOCaug/dataset/cls_png/<id>.png      # the same labels, converted at prepare time (what is read)
        VOCaug/dataset/{train,val,trainval}.txt

    Missing PNGs are a :class:`~encoding.datasets.DatasetError` naming the folder and the prepare command.
    See :class:`BaseDataset` for the arguments.
    """

    NAME = "pascal_aug"
    NUM_CLASS = 21
    CLASSES = VOC_CLASSES
    PALETTE = VOC_PALETTE
    IGNORE_COLOR = VOC_IGNORE_COLOR
    SPLITS = ("train", "val", "trainval")
    PREPARE_SCRIPT = "scripts/prepare_pascal.py"
    BASE_DIR = SBD_DIR

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        base = self.dataset_dir
        masks = self._prepared(os.path.join(base, SBD_PNG_DIR), "the SBD labels converted to PNG")
        return list_split(os.path.join(base, self.split + ".txt"), os.path.join(base, "img"), ".jpg", masks, ".png")
