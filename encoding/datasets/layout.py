"""Where each dataset lives under the data root: the names that loading and preparation share.

The dataset classes read these folders and :mod:`encoding.datasets.prepare` writes them; both import this module and
neither imports the other for a folder name. It declares names and paths only (plus the error raised when a file is
not where this layout says, the data root, the split-file reader both sides use, and the check of splits that share
images), so it imports nothing of ``encoding`` but its errors.

Example:
    >>> import os
    >>> from encoding.datasets.layout import COCO_DIR, COCO_MASK_DIR
    >>> os.path.join(COCO_DIR, COCO_MASK_DIR, "val2017.txt")
    'coco/masks_voc/val2017.txt'
"""
from __future__ import annotations

import os
import warnings
from collections import Counter
from typing import Any, List, Sequence

from ..errors import EXIT_USAGE, EncodingError

__all__ = [
    "DatasetError", "default_root", "read_split_file", "shared_images", "warn_shared_images",
    "ADE20K_DIR", "VOC_DIR", "SBD_DIR", "SBD_MAT_DIR", "SBD_PNG_DIR", "CONTEXT_DIR", "CONTEXT_MASK_DIR",
    "CONTEXT_LIST_DIR", "CONTEXT_CATEGORY_IDS", "CITYS_DIR", "COCO_DIR", "COCO_MASK_DIR", "COCO_VOC_CATEGORY_IDS",
    "SHAPES_CLASSES", "SHAPES_DEFAULT_SEED", "SHAPES_DEFAULT_NUM_TRAIN", "SHAPES_DEFAULT_NUM_VAL", "shapes_folder",
]


class DatasetError(ValueError, EncodingError):
    """A dataset file is missing, unreadable or inconsistent: the data handed to the package cannot be used (one line
    naming the file; exit status 2).

    Attributes:
        path: the offending file or folder.
        problem: what is wrong with it.
    """

    exit_status = EXIT_USAGE

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def default_root() -> str:
    """The data root: ``$ENCODING_DATA`` if set, else ``~/.encoding/data``."""
    return os.path.expanduser(os.environ.get("ENCODING_DATA") or os.path.join("~", ".encoding", "data"))


def read_split_file(path: str) -> List[str]:
    """Read a split list (one sample id per line; blank lines and ``#`` comments skipped).

    Raises:
        DatasetError: the file is missing or lists no sample.
    """
    if not os.path.isfile(path):
        raise DatasetError(path, "split file is missing")
    with open(path, encoding="utf-8") as f:
        ids = [line.split()[0] for line in f if line.strip() and not line.lstrip().startswith("#")]
    if not ids:
        raise DatasetError(path, "split file is empty")
    repeated = [i for i, n in Counter(ids).items() if n > 1]
    if repeated:
        warnings.warn(f"{path}: lists {len(repeated)} sample id(s) more than once (e.g. {repeated[0]!r}): each counts "
                      "as many times, in training and in scores", RuntimeWarning, stacklevel=2)
    return ids


#: ADE20K (MIT Scene Parsing).
ADE20K_DIR = "ADEChallengeData2016"
#: PASCAL VOC 2012.
VOC_DIR = os.path.join("VOCdevkit", "VOC2012")
#: SBD (``pascal_aug``): ``cls/<id>.mat`` as published, ``cls_png/<id>.png`` converted at prepare time.
SBD_DIR = os.path.join("VOCaug", "dataset")
SBD_MAT_DIR, SBD_PNG_DIR = "cls", "cls_png"
#: PASCAL-Context: VOC 2010 images, label PNGs and split lists written at prepare time from the JSON.
CONTEXT_DIR = os.path.join("VOCdevkit", "VOC2010")
CONTEXT_MASK_DIR = "SegmentationClassContext"
CONTEXT_LIST_DIR = os.path.join("ImageSets", "SegmentationContext")
#: PASCAL-Context (459-label) category ids of the 59 classes, in class order (ascending id).
CONTEXT_CATEGORY_IDS = (
    2, 9, 18, 19, 22, 23, 25, 31, 33, 34, 44, 45, 46, 59, 65, 68, 72, 80, 85, 98, 104, 105, 113, 115, 144, 158, 159,
    162, 187, 189, 207, 220, 232, 258, 259, 260, 284, 295, 296, 308, 324, 326, 347, 349, 354, 355, 360, 366, 368,
    397, 415, 416, 420, 424, 427, 440, 445, 454, 458,
)
#: Cityscapes (both packages extracted here).
CITYS_DIR = "citys"
#: COCO 2017; the VOC-class masks and their lists are written under ``masks_voc`` at prepare time.
COCO_DIR = "coco"
COCO_MASK_DIR = "masks_voc"
#: COCO category id of each VOC class, in VOC class order (0 = background).
COCO_VOC_CATEGORY_IDS = (0, 5, 2, 16, 9, 44, 6, 3, 17, 62, 21, 67, 18, 19, 4, 1, 64, 20, 63, 7, 72)

#: The embedded ``shapes`` dataset: its classes and the generator settings of the default folder.
SHAPES_CLASSES = ("background", "disc", "square", "triangle", "star", "ring", "bar")
SHAPES_DEFAULT_SEED, SHAPES_DEFAULT_NUM_TRAIN, SHAPES_DEFAULT_NUM_VAL = 0, 3000, 100


def shapes_folder(seed: int, num_train: int, num_val: int) -> str:
    """The ``shapes`` folder name of these settings: ``shapes`` for the defaults, else
    ``shapes-seed<seed>-<train>-<val>`` (different settings never overwrite each other)."""
    if (seed, num_train, num_val) == (SHAPES_DEFAULT_SEED, SHAPES_DEFAULT_NUM_TRAIN, SHAPES_DEFAULT_NUM_VAL):
        return "shapes"
    return f"shapes-seed{seed}-{num_train}-{num_val}"


def shared_images(trained: Sequence[str], scored: Sequence[str]) -> List[str]:
    """The images of ``scored`` that ``trained`` holds too (the same file under any path: compared by real path)."""
    real = {os.path.realpath(p) for p in trained}
    return [p for p in scored if os.path.realpath(p) in real]


def warn_shared_images(train: Any, val: Any) -> None:
    """Warn of a validation set that shares images with the training set (VOC's ``trainval`` holds ``val``): its
    scores would be of images the network trains on."""
    scored = list(getattr(val, "images", None) or ())
    shared = shared_images(getattr(train, "images", None) or (), scored)
    if shared:
        warnings.warn(f"the {getattr(val, 'split', 'validation')!r} split shares {len(shared)} of its {len(scored)} "
                      f"images with the {getattr(train, 'split', 'training')!r} split it trains on (e.g. "
                      f"{shared[0]}): its scores are of images the network trains on", RuntimeWarning, stacklevel=3)
