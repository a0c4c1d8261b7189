"""``shapes``: the embedded segmentation dataset that needs no download (7 classes: background + 6 shapes).

The scenes are rendered once by the prepare step :func:`~encoding.datasets.prepare.shapes_render.ensure_shapes`
(``python -m encoding.datasets.prepare shapes``), which :class:`ShapesSegmentation` runs on first use, and read here
in the VOC layout the real datasets use::

    <root>/shapes/JPEGImages/<id>.jpg
    <root>/shapes/SegmentationClass/<id>.png          # 0 = background, 1..6 = objects, 255 = ignore
    <root>/shapes/ImageSets/{train,val,trainval}.txt
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from .base import BaseDataset
from .layout import (SHAPES_CLASSES, SHAPES_DEFAULT_NUM_TRAIN, SHAPES_DEFAULT_NUM_VAL, SHAPES_DEFAULT_SEED,
                     shapes_folder)
from .pascal_voc import list_split
from .prepare.shapes_render import ensure_shapes

__all__ = ["ShapesSegmentation", "SHAPES_CLASSES", "SHAPES_PALETTE"]

#: Seven distinct colours (background black; ignored pixels are drawn white).
SHAPES_PALETTE = (
    (0, 0, 0), (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
)


class ShapesSegmentation(BaseDataset):
    """The embedded ``shapes`` dataset (7 classes: background + 6 shapes), generated on first use.

    Args:
        root, split, mode, ...: see :class:`BaseDataset` (splits ``train``, ``val``, ``trainval``).
        seed: generator seed (other seeds live in their own folder).
        num_train, num_val: number of generated training / validation scenes.
        generate: generate the data if it is missing (``False``: raise instead).
        progress: show a progress bar while generating.

    Example:
        >>> ds = ShapesSegmentation(split="val", mode="testval")  # doctest: +SKIP
        >>> image, mask = ds[0]       # float32 3xHxW (normalised), int64 HxW with -1 = ignore
    """

    NAME = "shapes"
    NUM_CLASS = len(SHAPES_CLASSES)
    CLASSES = SHAPES_CLASSES
    PALETTE = SHAPES_PALETTE
    IGNORE_COLOR = (255, 255, 255)  # the background is black
    SPLITS = ("train", "val", "trainval")
    BASE_SIZE = 160
    CROP_SIZE = 128
    SCALE_RANGE = (0.75, 1.5)

    def __init__(self, root: Optional[str] = None, split: str = "train", mode: Optional[str] = None, *args,
                 seed: int = SHAPES_DEFAULT_SEED, num_train: int = SHAPES_DEFAULT_NUM_TRAIN,
                 num_val: int = SHAPES_DEFAULT_NUM_VAL, generate: bool = True, progress: bool = True,
                 **kwargs) -> None:
        self.seed, self.num_train, self.num_val = seed, num_train, num_val
        self._generate, self._progress = generate, progress
        super().__init__(root, split, mode, *args, **kwargs)

    @property
    def dataset_dir(self) -> str:
        return os.path.join(self.root, shapes_folder(self.seed, self.num_train, self.num_val))

    def _check_root(self) -> None:
        if self._generate:
            ensure_shapes(self.root, seed=self.seed, num_train=self.num_train, num_val=self.num_val,
                          progress=self._progress)
        else:
            super()._check_root()

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        base = self.dataset_dir
        return list_split(os.path.join(base, "ImageSets", self.split + ".txt"), os.path.join(base, "JPEGImages"),
                          ".jpg", os.path.join(base, "SegmentationClass"), ".png")
