"""``folder``: a user's own images and masks, in the layouts people have, with no code.

Layouts of the folder ``DIR`` (``train.py --dataset folder --data-root DIR``), tried in this order:

* ``DIR/splits/{train,val}.txt`` list files over ``DIR/images`` + ``DIR/masks``: one sample per line, a file stem
  (``0001``) or an ``image mask`` pair of paths relative to ``DIR``;
* ``DIR/{train,val}/{images,masks}``;
* mmsegmentation's ``DIR/img_dir/{train,val}`` + ``DIR/ann_dir/{train,val}``;
* ``DIR/images/*`` + ``DIR/masks/*``.

Images and masks are matched by file stem (any extension PIL reads; sub-folders keep their relative path). Without a
``val`` split a seeded hold-out of ``val_fraction`` of the samples validates; its file list is written to the run
directory (``holdout_file``) and read back by a resumed or repeated run, so it validates on the same images. The
classes come from ``DIR/classes.{yaml,json,txt}`` (:mod:`.folder_meta`) or from the one scan of the masks
(:mod:`.scan`), which checks every file before training.
"""
from __future__ import annotations

import os
import random
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

from ..utils.files import atomic_write
from ..utils.palette import generated_palette
from .base import BaseDataset, INVALID_LABEL
from .folder_meta import DataError, color_lookup, read_class_file, read_mask
from .layout import read_split_file
from .scan import FolderScan, check_scan, scan_pairs
from .transforms import LABEL_IGNORE

__all__ = ["FolderSegmentation", "find_splits", "hold_out", "HOLDOUT_NAME"]

#: The hold-out list a training run writes to its run directory.
HOLDOUT_NAME = "holdout.txt"
Pair = Tuple[str, str]
_SKIP = {"classes.yaml", "classes.yml", "classes.json", "classes.txt"}


def _image_exts() -> set:
    return {ext.lower() for ext in Image.registered_extensions()}


def _by_stem(folder: str) -> Dict[str, str]:
    """Relative stem (``sub/name``) -> path of every image file under ``folder``."""
    exts, found = _image_exts(), {}
    for base, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            stem, ext = os.path.splitext(name)
            if name.startswith(".") or name in _SKIP or ext.lower() not in exts:
                continue
            key = os.path.relpath(os.path.join(base, stem), folder)
            if key in found:
                raise DataError(os.path.join(base, name), f"has the same stem as {found[key]}: one file per "
                                                             "sample")
            found[key] = os.path.join(base, name)
    return found


def _pairs(image_dir: str, mask_dir: str) -> List[Pair]:
    """The image/mask pairs of two folders, matched by stem; unpaired files are an error listing them."""
    if not os.path.isdir(mask_dir):
        raise DataError(mask_dir, f"mask folder is missing (the images are in {image_dir})")
    images, masks = _by_stem(image_dir), _by_stem(mask_dir)
    lonely = [images[k] for k in images if k not in masks] + [masks[k] for k in masks if k not in images]
    if lonely:
        no_mask = [os.path.basename(images[k]) for k in images if k not in masks]
        no_image = [os.path.basename(masks[k]) for k in masks if k not in images]
        parts = ([f"{len(no_mask)} image(s) without a mask in {mask_dir}: {', '.join(no_mask[:5])}"] if no_mask
                 else []) + ([f"{len(no_image)} mask(s) without an image in {image_dir}: "
                              f"{', '.join(no_image[:5])}"] if no_image else [])
        raise DataError(lonely[0], "unpaired: " + "; ".join(parts))
    if not images:
        raise DataError(image_dir, "holds no image file")
    return [(images[k], masks[k]) for k in sorted(images)]


def _listed(root: str, split_file: str) -> List[Pair]:
    """The pairs of a list file: stems over ``images/`` + ``masks/``, or ``image mask`` relative paths."""
    images, masks = _by_stem(os.path.join(root, "images")), _by_stem(os.path.join(root, "masks"))
    pairs = []
    with open(split_file, encoding="utf-8") as f:
        lines = [line.split() for line in f if line.strip() and not line.lstrip().startswith("#")]
    for parts in lines:
        if len(parts) >= 2:
            pairs.append((os.path.join(root, parts[0]), os.path.join(root, parts[1])))
            continue
        stem = os.path.splitext(parts[0])[0] if parts[0] not in images else parts[0]
        if stem not in images or stem not in masks:
            side = "an image in images/" if stem not in images else "a mask in masks/"
            raise DataError(split_file, f"lists {parts[0]!r}, which has no {side}")
        pairs.append((images[stem], masks[stem]))
    for image, mask in pairs:
        for path, kind in ((image, "image"), (mask, "mask")):
            if not os.path.isfile(path):
                raise DataError(path, f"{kind} file is missing (listed in {split_file})")
    if not pairs:
        raise DataError(split_file, "split file is empty")
    return pairs


def find_splits(root: str) -> Tuple[str, Dict[str, List[Pair]]]:
    """``(layout name, split -> pairs)`` of a folder dataset; ``all`` is the only key of an unsplit folder.

    Raises:
        DatasetError: no known layout, unpaired files (listed), or list entries without files.
    """
    join = os.path.join
    if os.path.isdir(join(root, "splits")):
        names = sorted(n[:-4] for n in os.listdir(join(root, "splits")) if n.endswith(".txt"))
        if not names:
            raise DataError(join(root, "splits"), "holds no <split>.txt list file")
        return "splits", {n: _listed(root, join(root, "splits", n + ".txt")) for n in names}
    split_dirs = [n for n in ("train", "val", "test") if os.path.isdir(join(root, n, "images"))]
    if split_dirs:
        return "split folders", {n: _pairs(join(root, n, "images"), join(root, n, "masks")) for n in split_dirs}
    if os.path.isdir(join(root, "img_dir")):
        names = sorted(n for n in os.listdir(join(root, "img_dir")) if os.path.isdir(join(root, "img_dir", n)))
        return "mmsegmentation", {n: _pairs(join(root, "img_dir", n), join(root, "ann_dir", n)) for n in names}
    if os.path.isdir(join(root, "images")):
        return "images + masks", {"all": _pairs(join(root, "images"), join(root, "masks"))}
    raise DataError(root, "is not a folder dataset: expected images/ + masks/, train/ and val/ each holding "
                             "images/ + masks/, img_dir/ + ann_dir/ (mmsegmentation), or splits/{train,val}.txt "
                             "(see docs/own-data.md)")


def hold_out(pairs: List[Pair], fraction: float, seed: int, root: str,
             holdout_file: Optional[str] = None) -> Tuple[List[Pair], List[Pair]]:
    """``(train, val)``: the samples listed in ``holdout_file`` when it exists, else a seeded draw of ``fraction``.

    Raises:
        DatasetError: fewer than 2 samples, or a hold-out file naming a sample the dataset does not have.
    """
    by_name = {os.path.relpath(image, root): (image, mask) for image, mask in pairs}
    if holdout_file and os.path.isfile(holdout_file):
        names = read_split_file(holdout_file)
        missing = [n for n in names if n not in by_name]
        if missing:
            raise DataError(holdout_file, f"lists {missing[0]!r}, which is not in {root} any more; delete the "
                                             "file to draw a new hold-out")
    else:
        if not 0.0 < fraction < 1.0 or len(pairs) < 2:
            raise DataError(root, f"has no val split and {len(pairs)} sample(s): a hold-out needs 2 or more "
                                     f"samples and 0 < --val-fraction < 1 (got {fraction})")
        order = sorted(by_name)
        random.Random(seed).shuffle(order)
        names = sorted(order[:min(len(order) - 1, max(1, round(fraction * len(order))))])
    chosen = set(names)
    return [p for n, p in sorted(by_name.items()) if n not in chosen], [by_name[n] for n in names]


class FolderSegmentation(BaseDataset):
    """A folder of images and masks (``train.py --dataset folder --data-root DIR``); see the module docstring.

    Args:
        root: the dataset folder (required).
        split, mode, ...: see :class:`BaseDataset`.
        val_fraction: the hold-out share when the folder has no ``val`` split.
        holdout_file: where the hold-out list is read from (when it exists); :meth:`save_holdout` writes it.
        holdout_seed: the seed of the hold-out draw.
        unknown_labels: ``error`` (default): a mask value outside the classes stops the scan; ``ignore``: such
            pixels are ignored (and counted).
        scan_cache: keep the scan records in ``DIR/.encoding-scan.json``.

    The instance carries the metadata a registered class declares: ``CLASSES``, ``NUM_CLASS``, ``PALETTE`` (the
    class file's colours, else generated), ``IGNORE_COLOR``; ``scan`` is the :class:`~.scan.FolderScan`.
    """

    NAME = "folder"
    SPLITS = ("train", "val")
    BASE_SIZE = 520
    CROP_SIZE = 480

    def __init__(self, root: Optional[str] = None, split: str = "train", mode: Optional[str] = None, *args: Any,
                 val_fraction: float = 0.1, holdout_file: Optional[str] = None, holdout_seed: int = 0,
                 unknown_labels: str = "error", scan_cache: bool = True, **kwargs: Any) -> None:
        if root is None:
            raise DataError("--data-root", "the folder dataset needs the folder: --data-root DIR (root= in Python)")
        root = os.path.abspath(os.path.expanduser(root))
        if not os.path.isdir(root):
            raise DataError(root, "folder dataset not found")
        self.layout, splits = find_splits(root)
        self.holdout: Optional[List[str]] = None
        if "train" not in splits and "all" not in splits:
            raise DataError(root, f"has no train split ({self.layout} layout with {', '.join(sorted(splits))})")
        if "val" not in splits:
            pool = splits.pop("all", None) or splits.pop("train")
            splits["train"], splits["val"] = hold_out(pool, val_fraction, holdout_seed, root, holdout_file)
            self.holdout = [os.path.relpath(image, root) for image, _ in splits["val"]]
        self.SPLITS = tuple(splits)
        self._split_pairs = splits
        self.unknown_labels = unknown_labels
        spec = read_class_file(root)
        every = [pair for name in sorted(splits) for pair in splits[name]]
        self.scan: FolderScan = check_scan(scan_pairs(root, every, cache=scan_cache), spec, unknown_labels)
        spec = self.scan.spec
        self.CLASSES, self.NUM_CLASS = tuple(spec.names), len(spec.names)
        self.PALETTE = spec.colors or generated_palette(len(spec.names))
        self.IGNORE_COLOR = spec.ignore_color or next(c for c in [(0, 0, 0), (255, 255, 255)] + list(
            generated_palette(256)) if c not in self.PALETTE)
        self.ignore_value = spec.ignore_index
        self._colors = color_lookup(spec)
        super().__init__(root, split, mode, *args, **kwargs)

    def _check_root(self) -> None:
        pass  # checked in __init__ (the layout is found before the base class runs)

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        pairs = self._split_pairs[self.split]
        return [image for image, _ in pairs], [mask for _, mask in pairs]

    def label_table(self) -> np.ndarray:  # type: ignore[override]
        """Raw value -> class index: the class ids, the ignore value (255 = foreground for 0/255 masks), and
        values outside the classes ignored with ``unknown_labels="ignore"``."""
        fill = LABEL_IGNORE if self.unknown_labels == "ignore" else INVALID_LABEL
        table = np.full(256, fill, dtype=np.uint8)
        table[:self.NUM_CLASS] = np.arange(self.NUM_CLASS)
        if self.scan.binary_255:
            table[255] = 1
        else:
            table[self.ignore_value] = LABEL_IGNORE
        return table

    def _read_label(self, path: str) -> np.ndarray:
        kind, values = read_mask(path)
        if kind == "index":
            return values
        found, inverse = np.unique(values, return_inverse=True)
        unknown = LABEL_IGNORE if self.unknown_labels == "ignore" else INVALID_LABEL
        mapped = np.array([self._colors.get(int(c), unknown) for c in found], dtype=np.int64)
        return mapped[inverse].reshape(values.shape)

    def save_holdout(self, path: str) -> Optional[str]:
        """Write the hold-out list (one image path relative to the root per line) to ``path``; ``None`` when the
        folder has its own ``val`` split or ``path`` already holds the list."""
        if self.holdout is None or os.path.isfile(path):
            return None
        atomic_write(path, "# the hold-out validation images of this run (relative to the data root)\n"
                     + "".join(f"{name}\n" for name in self.holdout))
        return path
