"""``folder``: a user's own images and masks, in the layouts people have, with no code.

Layouts of the folder ``DIR`` (``train.py --dataset folder --data-root DIR``), tried in this order:

* ``DIR/splits/{train,val}.txt`` list files over ``DIR/images`` + ``DIR/masks``: one sample per line, a file stem
  (``0001``) or an ``image mask`` pair of paths relative to ``DIR`` (:func:`~.pairing.read_pair_list`);
* ``DIR/{train,val}/{images,masks}``;
* mmsegmentation's ``DIR/img_dir/{train,val}`` + ``DIR/ann_dir/{train,val}``;
* ``DIR/images/{train,val}`` + ``DIR/masks/{train,val}``;
* ``DIR/images/*`` + ``DIR/masks/*``.

A split folder or list may be named ``valid`` / ``validation`` (``training``, ``testing``): it is that split.

Images and masks are matched by file stem (any extension PIL reads; sub-folders keep their relative path), or by the
stem without a suffix that every mask shares (``0001.jpg`` + ``0001_mask.png``; :mod:`.pairing`). Without a ``val``
split a seeded hold-out of ``val_fraction`` of the samples validates; its file list is written to the run directory
as JSON (:data:`HOLDOUT_NAME`, any legal file name survives) and read back by a resumed or repeated run, so it
validates on the same images. The classes come from ``DIR/classes.{yaml,json,txt}`` (:mod:`.folder_meta`) or from
the one scan of the masks (:mod:`.scan`), which checks every file and audits the labels before training. Nothing is
ever written into ``DIR`` (it may be read-only).
"""
from __future__ import annotations

import json
import os
import random
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ..utils.files import atomic_write
from ..utils.palette import generated_palette
from .base import BaseDataset
from .labels import INVALID_LABEL, table_classes
from .folder_meta import color_lookup, format_colors, read_class_file, read_mask
from .layout import DatasetError, shared_images
from .pairing import Pair, Problem, by_stem, pair_folders, read_pair_list
from .scan import FolderScan, cache_file, check_scan, record_key, scan_pairs
from .transforms import LABEL_IGNORE

__all__ = ["FolderSegmentation", "find_splits", "hold_out", "holdout_path", "read_holdout", "HOLDOUT_NAME",
           "LEGACY_HOLDOUT_NAME", "HOLDOUT_SEED", "SPLIT_ALIASES"]

#: The hold-out list a training run writes to its run directory (JSON: any legal file name survives).
HOLDOUT_NAME = "holdout.json"
#: The hold-out list of earlier runs (one name per line), still read.
LEGACY_HOLDOUT_NAME = "holdout.txt"
#: The seed of a hold-out drawn with the defaults: ``train.py``'s default ``--seed`` (the run draws with its seed),
#: so a dataset built in Python with the defaults validates on the images a default run held out.
HOLDOUT_SEED = 1


def holdout_path(run_dir: str) -> str:
    """The hold-out list of the run in ``run_dir``: :data:`HOLDOUT_NAME`, or an earlier run's
    :data:`LEGACY_HOLDOUT_NAME` when only that one exists."""
    legacy, path = os.path.join(run_dir, LEGACY_HOLDOUT_NAME), os.path.join(run_dir, HOLDOUT_NAME)
    return legacy if os.path.isfile(legacy) and not os.path.isfile(path) else path


def read_holdout(path: str) -> List[str]:
    """The image paths (relative to the data root) of a hold-out list: JSON (``{"images": [...]}``), or an earlier
    run's text file (one name per line, the whole line: names with spaces survive).

    Raises:
        DatasetError: the file is unreadable or lists nothing.
    """
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(path, f"cannot read the hold-out list ({err})") from None
    if not path.endswith(".json"):
        names = [n for n in text.split("\n") if n.strip() and not n.lstrip().startswith("#")]
        return [n[:-1] if n.endswith("\r") else n for n in names]
    try:
        names = json.loads(text).get("images")
    except (ValueError, AttributeError):
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise DatasetError(path, 'is not a hold-out list ({"images": [paths relative to the data root]}); delete it '
                                 "to draw a new hold-out")
    return names


#: Other names of the splits (Roboflow's ``valid``, ADE20K's ``training`` / ``validation``), read as those splits.
SPLIT_ALIASES = {"training": "train", "valid": "val", "validation": "val", "testing": "test"}
_SPLIT_NAMES = ("train", "val", "test")


def _by_split(names: List[str], where: str) -> Dict[str, str]:
    """Split -> the folder or list (named in ``where``) holding it, an alias read as its split.

    Raises:
        DatasetError: two names of one split (``val`` and ``valid``): which one validates would be a guess.
    """
    found: Dict[str, str] = {}
    for name in sorted(names):
        split = SPLIT_ALIASES.get(name, name)
        if split in found:
            raise DatasetError(os.path.join(where, name), f"is split {split!r} as {found[split]!r} is: keep one "
                                                          "(or list the samples in splits/*.txt)")
        found[split] = name
    return found


def _split_dirs(folder: str, inside: str = "") -> Dict[str, str]:
    """Split -> sub-folder of ``folder`` named after a split or an alias (holding ``inside`` when given)."""
    names = [n for n in os.listdir(folder) if SPLIT_ALIASES.get(n, n) in _SPLIT_NAMES
             and os.path.isdir(os.path.join(folder, n, inside))] if os.path.isdir(folder) else []
    return _by_split(names, folder)


def find_splits(root: str) -> Tuple[str, Dict[str, List[Pair]], List[Problem]]:
    """``(layout name, split -> pairs, unpaired files)`` of a folder dataset; ``all`` is the only key of an unsplit
    folder. The unpaired files are problems for the scan's report (:func:`~.pairing.pair_folders`). A split folder or
    list named ``valid`` / ``validation`` (``training``, ``testing``) is that split (:data:`SPLIT_ALIASES`).

    Raises:
        DatasetError: no known layout, no file that pairs, list entries without files, or two names of one split.
    """
    join = os.path.join
    if os.path.isdir(join(root, "splits")):
        files = {n: join(root, "splits", f + ".txt") for n, f in _by_split(
            [n[:-4] for n in os.listdir(join(root, "splits")) if n.endswith(".txt")], join(root, "splits")).items()}
        if not files:
            raise DatasetError(join(root, "splits"), "holds no <split>.txt list file")
        lists = {n: read_pair_list(root, path) for n, path in files.items()}
        for name, pairs in lists.items():
            _check_once(pairs, files[name], root, training=_training_list(name))
        _check_apart(lists, root, files)
        return "splits", lists, []
    split_dirs, nested = _split_dirs(root, "images"), _split_dirs(join(root, "images"))
    if split_dirs:
        layout, folders = "split folders", {n: (join(root, d, "images"), join(root, d, "masks"))
                                            for n, d in split_dirs.items()}
    elif os.path.isdir(join(root, "img_dir")):
        names = _by_split([n for n in os.listdir(join(root, "img_dir")) if os.path.isdir(join(root, "img_dir", n))],
                          join(root, "img_dir"))
        layout, folders = "mmsegmentation", {n: (join(root, "img_dir", d), join(root, "ann_dir", d))
                                             for n, d in names.items()}
    elif nested:  # images/{train,val}/ + masks/{train,val}/: the sub-folders are the splits, never one pool
        stray = next((p for k, p in by_stem(join(root, "images")).items() if k.split(os.sep)[0] not in
                      nested.values()), None)
        if stray is not None:
            raise DatasetError(stray, f"is outside the split folders of {join(root, 'images')} "
                                      f"({', '.join(sorted(nested.values()))}): move it into one of them")
        layout, folders = "images + masks by split", {n: (join(root, "images", d), join(root, "masks", d))
                                                      for n, d in nested.items()}
    elif os.path.isdir(join(root, "images")):
        layout, folders = "images + masks", {"all": (join(root, "images"), join(root, "masks"))}
    else:
        raise DatasetError(root, "is not a folder dataset: expected images/ + masks/, train/ and val/ each holding "
                                 "images/ + masks/, img_dir/ + ann_dir/ (mmsegmentation), or splits/{train,val}.txt "
                                 "(see docs/own-data.md)")
    splits, problems = {}, []
    for name, (images, masks) in folders.items():
        if name == "test" and not os.path.isdir(masks):  # unlabelled test images: nothing to train on or score
            continue
        splits[name], unpaired = pair_folders(images, masks)
        problems += unpaired
    return layout, splits, problems


def _check_once(pairs: List[Pair], path: str, root: str, training: bool) -> None:
    """Refuse a validation (or test) list that names an image twice: its scores would count it twice. A training
    list may repeat images on purpose (seen as many times an epoch): it is warned of."""
    first: Dict[str, int] = {}
    repeats = []
    for i, (image, _) in enumerate(pairs):
        earlier = first.setdefault(os.path.realpath(image), i)
        if earlier != i:
            repeats.append((image, earlier, i))
    if not repeats:
        return
    image, a, b = repeats[0]
    what = (f"lists {len(repeats)} image(s) again (e.g. {os.path.relpath(image, root)}, entries {a + 1} and "
            f"{b + 1})")
    if training:
        warnings.warn(f"{path}: {what}: each is trained on as many times an epoch", RuntimeWarning, stacklevel=2)
        return
    raise DatasetError(path, f"{what}: its scores would count each as many times; list each image once")


def _training_list(name: str) -> bool:
    """A list to train on: ``train``, or one named after it (``trainval``, ``train_aug``: VOC's lists, whose
    ``trainval`` holds ``val`` by design; a run validating on images it trains on is warned of by the loaders)."""
    return name.startswith("train")


def _check_apart(lists: Dict[str, List[Pair]], root: str, files: Dict[str, str]) -> None:
    """Refuse a validation (or test) list (``files``: each split's list file) that shares images with the training
    list: its scores would be of images the network trained on."""
    trained = [image for image, _ in lists.get("train", ())]
    for name, pairs in lists.items():
        shared = [] if _training_list(name) else shared_images(trained, [image for image, _ in pairs])
        if shared:
            raise DatasetError(files[name], f"lists {len(shared)} image(s) that {os.path.basename(files['train'])} "
                               f"lists too (e.g. {os.path.relpath(shared[0], root)}): its scores would be of images "
                               "the network trained on; list each image in one split")


def hold_out(pairs: List[Pair], fraction: float, seed: int, root: str,
             holdout_file: Optional[str] = None) -> Tuple[List[Pair], List[Pair]]:
    """``(train, val)``: the samples listed in ``holdout_file`` when it exists, else a seeded draw of ``fraction``.

    Raises:
        DatasetError: fewer than 2 samples, or a hold-out file naming a sample the dataset does not have.
    """
    named = [(os.path.relpath(image, root), (image, mask)) for image, mask in pairs]
    by_name = dict(named)  # the draw is over images; an image a list repeats stays repeated in train
    if holdout_file and os.path.isfile(holdout_file):
        names = read_holdout(holdout_file)
        missing = [n for n in names if n not in by_name]
        if missing or not names:
            raise DatasetError(holdout_file, f"lists {missing[0]!r}, which is not in {root} any more; delete the "
                                             "file to draw a new hold-out" if missing else "lists no image")
    else:
        if not 0.0 < fraction < 1.0 or len(pairs) < 2:
            raise DatasetError(root, f"has no val split and {len(pairs)} sample(s): a hold-out needs 2 or more "
                                     f"samples and 0 < --val-fraction < 1 (got {fraction})")
        order = sorted(by_name)
        random.Random(seed).shuffle(order)
        names = sorted(order[:min(len(order) - 1, max(1, round(fraction * len(order))))])
    chosen = set(names)
    return [p for n, p in sorted(named, key=lambda item: item[0]) if n not in chosen], [by_name[n] for n in names]


class FolderSegmentation(BaseDataset):
    """A folder of images and masks (``train.py --dataset folder --data-root DIR``); see the module docstring.

    Args:
        root: the dataset folder (required).
        split, mode, ...: see :class:`BaseDataset`.
        val_fraction: the hold-out share when the folder has no ``val`` split.
        holdout_file: where the hold-out list is read from (when it exists); :meth:`save_holdout` writes it.
        holdout_seed: the seed of the hold-out draw (default :data:`HOLDOUT_SEED`, ``train.py``'s default
            ``--seed``).
        unknown_labels: ``error`` (default): a mask value outside the classes stops the scan; ``ignore``: such
            pixels are ignored (and counted), 16-bit values past 255 too.
        binary: a ``--binary`` run: 0/255 masks are background / foreground even with a two-class file; masks mixing
            0/1 and 0/255 are refused.
        scan_cache: the scan's cache file: ``True`` (default) the user's cache folder
            (:func:`~.scan.cache_file`), a path, or ``False`` (no cache). Never in ``root``.

    The instance carries the metadata a registered class declares: ``CLASSES``, ``NUM_CLASS``, ``PALETTE`` (the
    class file's colours, else generated), ``IGNORE_COLOR``; ``scan`` is the :class:`~.scan.FolderScan` (with the
    label audit's ``warnings``).
    """

    NAME = "folder"
    SPLITS = ("train", "val")
    SPLITS_FROM_DATA = True  # an instance's SPLITS are the folder's (its lists, its split folders)
    BASE_SIZE = 520
    CROP_SIZE = 480
    WRITES_BESIDE_DATA = False  # the user's folder: nothing is ever written into it

    def __init__(self, root: Optional[str] = None, split: str = "train", mode: Optional[str] = None, *args: Any,
                 val_fraction: float = 0.1, holdout_file: Optional[str] = None, holdout_seed: int = HOLDOUT_SEED,
                 unknown_labels: str = "error", binary: bool = False, scan_cache: Union[bool, str] = True,
                 **kwargs: Any) -> None:
        if root is None:
            raise DatasetError("--data-root", "the folder dataset needs the folder: --data-root DIR (root= in Python)")
        root = os.path.abspath(os.path.expanduser(root))
        if not os.path.isdir(root):
            raise DatasetError(root, "folder dataset not found")
        self.layout, splits, unpaired = find_splits(root)
        self.holdout: Optional[List[str]] = None
        if "train" not in splits and "all" not in splits:
            raise DatasetError(root, f"has no train split ({self.layout} layout with {', '.join(sorted(splits))})")
        if "val" not in splits:
            pool = splits.pop("all", None) or splits.pop("train")
            splits["train"], splits["val"] = hold_out(pool, val_fraction, holdout_seed, root, holdout_file)
            self.holdout = [os.path.relpath(image, root) for image, _ in splits["val"]]
        if split not in splits:
            raise DatasetError(root, f"unknown split {split!r}; valid splits: {', '.join(sorted(splits))} (its "
                                     f"{self.layout} layout)")
        self.SPLITS = tuple(splits)
        self._split_pairs = splits
        self.unknown_labels = unknown_labels
        self.UNKNOWN_LABEL = LABEL_IGNORE if unknown_labels == "ignore" else INVALID_LABEL
        every = [pair for name in sorted(splits) for pair in splits[name]]
        cache = cache_file(root) if scan_cache is True else scan_cache or None
        records = scan_pairs(root, every, cache=cache)
        train = [record_key(root, image, mask) for image, mask in splits["train"]]
        self.scan: FolderScan = check_scan(records, read_class_file(root), unknown_labels, root=root,
                                           problems=unpaired, binary=binary, train=train)
        spec = self.scan.spec
        self.CLASSES, self.NUM_CLASS = tuple(spec.names), len(spec.names)
        self.PALETTE = spec.colors or generated_palette(len(spec.names))
        self.IGNORE_COLOR = spec.ignore_color or next(c for c in [(0, 0, 0), (255, 255, 255)] + list(
            generated_palette(256)) if c not in self.PALETTE)
        #: The raw mask value of ignored pixels (``None`` for 0/255 masks: 255 is their foreground).
        self.ignore_value: Optional[int] = None if self.scan.binary_255 else spec.ignore_index
        self._colors = color_lookup(spec)
        #: Packed colour -> final class index (the ignore colour: ignore), bypassing the index masks' label table.
        self._colour_classes = {c: v if v < self.NUM_CLASS else LABEL_IGNORE for c, v in self._colors.items()}
        super().__init__(root, split, mode, *args, **kwargs)
        self._names_below = os.path.commonpath([os.path.dirname(path) for path in self.images])

    def _check_root(self) -> None:
        pass  # checked in __init__ (the layout is found before the base class runs)

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        pairs = self._split_pairs[self.split]
        return [image for image, _ in pairs], [mask for _, mask in pairs]

    def sample_name(self, index: int) -> str:
        """The image's path below the folder its split's images share (``cam_a/0001.png``): the same file name may
        be in two sub-folders."""
        return os.path.relpath(self.images[index], self._names_below).replace(os.sep, "/")

    def label_encoding(self) -> bytes:
        """The label table and the class file's colours as classes (colour masks are read through them, not through
        the table: counts of earlier releases, which sent colours through it, are not this encoding's)."""
        colours = sorted(self._colour_classes.items())
        return super().label_encoding() + (json.dumps({"colour classes": colours}).encode() if colours else b"[]")

    @property
    def pred_offset(self) -> int:
        """1 with the class file's ``reduce_zero_label`` (class ``k`` is raw value ``k + 1``), else 0."""
        return self.scan.spec.first_value

    def label_table(self) -> np.ndarray:  # type: ignore[override]
        """Raw value -> class index: the class ids (from value 1 with ``reduce_zero_label``, 0 then ignored), the
        ignore value (255 = foreground for 0/255 masks), and values outside the classes ignored with
        ``unknown_labels="ignore"``."""
        table = np.full(256, self.UNKNOWN_LABEL, dtype=np.uint8)
        table[self.pred_offset:self.pred_offset + self.NUM_CLASS] = np.arange(self.NUM_CLASS)
        if self.pred_offset:  # reduce_zero_label: 0 is unlabelled
            table[0] = LABEL_IGNORE
        if self.scan.binary_255:
            table[255] = 1
        else:
            table[self.ignore_value] = LABEL_IGNORE
        return table

    def _classes(self, path: str) -> np.ndarray:
        """An index mask through the label table; a colour mask straight to class indices by the class file's
        colours (the ignore colour, and with ``unknown_labels="ignore"`` a colour of no class: ignore), as the scan
        counts them (never through the table, whose 255 is a 0/255 mask's foreground)."""
        kind, values = read_mask(path, self._colors)
        if kind == "index":
            return table_classes(values, self._table, self.NUM_CLASS, path, self.UNKNOWN_LABEL)
        found, inverse = np.unique(values, return_inverse=True)
        classes = np.array([self._colour_classes.get(int(c), self.UNKNOWN_LABEL) for c in found], dtype=np.uint8)
        unknown = found[classes == INVALID_LABEL]
        if unknown.size:
            raise DatasetError(path, f"colours {format_colors(unknown[:10].tolist())} are not class colours (nor the "
                                     "ignore colour)")
        return classes[inverse].reshape(values.shape)

    def save_holdout(self, path: str) -> Optional[str]:
        """Write the hold-out list to ``path`` as JSON (``{"root": ..., "images": [paths relative to the root]}``);
        ``None`` when the folder has its own ``val`` split or ``path`` already exists."""
        if self.holdout is None or os.path.isfile(path):
            return None
        return atomic_write(path, json.dumps({"root": self.root, "images": self.holdout}, ensure_ascii=False,
                                             indent=1) + "\n")
