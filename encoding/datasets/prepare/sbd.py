"""SBD's MATLAB labels (``pascal_aug``) converted once into label PNGs, and its ``trainval`` split.

SBD ships its labels as MATLAB files (struct ``GTcls`` with field ``Segmentation``). They are read with SciPy (the
``prepare`` extra, used only here) at prepare time (``python -m encoding.datasets.prepare pascal``) into
``cls_png/<id>.png``; :class:`~encoding.datasets.VOCAugSegmentation` reads those PNGs like every other dataset.
"""
from __future__ import annotations

import os
import zlib
from typing import Any, Callable, Tuple

import numpy as np
from PIL import Image
from ...errors import MissingDependency
from ...utils.progress import progress_bar as tqdm

from ..layout import SBD_MAT_DIR, SBD_PNG_DIR, DatasetError, read_split_file
from ...utils.files import atomic_write, staged_dir

__all__ = ["SBD_LABEL_VALUES", "read_sbd_segmentation", "convert_sbd_masks", "write_sbd_trainval"]


#: The values of an SBD label: the 20 classes, background 0, and 255 (ignore).
SBD_LABEL_VALUES = frozenset(range(21)) | {255}


def _loadmat() -> Tuple[Callable[..., Any], Tuple[type, ...]]:
    """SciPy's ``loadmat`` and what it raises for a file that is not (or no longer) a MATLAB file."""
    try:
        from scipy.io import loadmat
        from scipy.io.matlab import MatReadError
    except ImportError as e:
        raise MissingDependency("converting SBD's .mat labels needs SciPy: pip install scipy (or the 'prepare' extra); "
                                "only once: the labels are then saved as PNGs and read without it") from e
    return loadmat, (MatReadError, ValueError, OSError, TypeError, IndexError, KeyError, EOFError, zlib.error,
                     NotImplementedError)


def _labels(segmentation: Any, path: str) -> np.ndarray:
    """``segmentation`` as uint8, refused unless every value is a whole number of :data:`SBD_LABEL_VALUES` (a cast
    alone would wrap 300 into 44, -1 into 255 and 2.7 into 2)."""
    array = np.asarray(segmentation)
    if array.ndim != 2 or array.dtype.kind not in "biuf" or array.size == 0:
        raise DatasetError(path, f"GTcls.Segmentation is not a 2-D array of numbers (dtype {array.dtype}, "
                                 f"shape {array.shape})")
    values = np.unique(array)
    bad = [v for v in values.tolist() if v not in SBD_LABEL_VALUES]
    if bad:
        raise DatasetError(path, f"label values must be whole numbers in 0..20 or 255; found {bad[:5]}")
    return array.astype(np.uint8)


def read_sbd_segmentation(path: str) -> np.ndarray:
    """The ``GTcls.Segmentation`` array (uint8, 255 = ignore) of one SBD ``cls/<id>.mat`` file.

    Raises:
        DatasetError: the file is missing, not a MATLAB file, truncated, lacks ``GTcls.Segmentation``, or holds a
            value that is not a whole number in ``0..20`` or ``255``.
        ImportError: SciPy is not installed (``pip install "encoding[prepare]"``).
    """
    loadmat, unreadable = _loadmat()
    try:
        content = loadmat(path, squeeze_me=True, struct_as_record=False)
    except FileNotFoundError:
        raise DatasetError(path, "mask file is missing") from None
    except unreadable as e:
        raise DatasetError(path, f"cannot read .mat label ({type(e).__name__}: {e})") from e
    segmentation = getattr(content.get("GTcls"), "Segmentation", None)
    if segmentation is None:
        raise DatasetError(path, "expected a struct GTcls with a Segmentation field (SBD cls format)")
    return _labels(segmentation, path)


def convert_sbd_masks(base: str, *, overwrite: bool = False, progress: bool = True) -> str:
    """Convert every ``<base>/cls/<id>.mat`` into ``<base>/cls_png/<id>.png``, all or nothing.

    Args:
        base: the SBD dataset folder (``VOCaug/dataset``).
        overwrite: convert again even when the PNG folder exists.
        progress: show a progress bar.

    Returns:
        The PNG folder.
    """
    mat_dir, png_dir = os.path.join(base, SBD_MAT_DIR), os.path.join(base, SBD_PNG_DIR)
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


def write_sbd_trainval(base: str) -> str:
    """Write SBD's ``trainval.txt`` (train + val, de-duplicated, in order), the split PyTorch-Encoding reads.

    Returns:
        The list file ``<base>/trainval.txt``.
    """
    ids = read_split_file(os.path.join(base, "train.txt")) + read_split_file(os.path.join(base, "val.txt"))
    return atomic_write(os.path.join(base, "trainval.txt"), "".join(i + "\n" for i in dict.fromkeys(ids)))
