"""The common segmentation dataset: sample lists, checked file loading, label mapping and the mode transforms.

A concrete dataset only says where its files are (:meth:`BaseDataset._find_samples`), how to read a raw label file if
it is not a PNG (:meth:`BaseDataset._read_label`) and how raw label values map to class indices
(:meth:`BaseDataset.label_table`). Everything else (modes, transforms, validation, ``skip_bad``) lives here, so every
dataset -- including the embedded ``shapes`` -- goes through the same file-loading code path.

Modes:
    ``train``: random flip, long side to a random size in ``SCALE_RANGE * base_size`` (``[0.5, 2.0]`` for the real
    datasets), random crop to ``crop_size`` (image padded with 0 after normalisation, mask with ignore), optional
    photometric jitter.
    ``val``: short side resized to ``crop_size`` and a centre crop (``val_crop=False``: the whole image).
    ``testval``: the original image and mask (for multi-scale evaluation).
    ``test``: images only; returns ``(image, file_name)``.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import os
import warnings
from typing import Any, Callable, ClassVar, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset
from torchvision import tv_tensors

from ..errors import UsageError
from ..utils.images import ImageTooLarge, open_image, rgb_of, upright_size
from .folder_meta import read_index_mask
from .labels import INVALID_LABEL, ShiftedLabels, identity_table, mapped_table, shifted_table, table_classes
from .layout import DatasetError, default_root, read_split_file
from .transforms import (IMAGENET_MEAN, IMAGENET_STD, LeanCompose, PadTo, image_transform,
                         to_index_mask, train_joint_transform, transform_pair, user_transform, val_joint_transform)

__all__ = ["BaseDataset", "DatasetError", "default_root", "read_split_file", "identity_table", "shifted_table",
           "ShiftedLabels", "mapped_table", "MODES", "read_rgb", "check_image"]

MODES = ("train", "val", "testval", "test")


@contextlib.contextmanager
def _decoding(path: str) -> Iterator[None]:
    """Turn the failures of opening / decoding the image ``path`` into one-line :class:`DatasetError` s."""
    try:
        yield
    except FileNotFoundError:
        raise DatasetError(path, "image file is missing") from None
    except ImageTooLarge:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise DatasetError(path, f"cannot decode image ({e})") from e


def check_image(path: str, decode: bool = True) -> Tuple[int, int]:
    """Decode every pixel of the image ``path`` (a truncated file is caught): its ``(width, height)`` as
    :func:`read_rgb` shows it; ``decode=False``: the header only, size checked against the pixel limit, as stored.

    Raises:
        DatasetError: as :func:`read_rgb` (``decode=False``: a header that is no image's); ``ImageTooLarge``.
    """
    with _decoding(path), open_image(path) as im:
        if decode:
            im.load()
        return upright_size(im) if decode else im.size


def read_rgb(path: str) -> np.ndarray:
    """The one image reader (datasets, ``demo.py``, ``test.py``): ``H x W x 3`` ``uint8`` RGB as it is displayed.

    The size is checked from the header first (:func:`~encoding.utils.images.open_image`: the one pixel limit); the
    EXIF orientation is applied (:func:`~encoding.utils.images.upright`: a phone's portrait JPEG comes out upright,
    the rule the folder scan applies too), 16-bit and 32-bit grey images are scaled to 8 bits (``65535 -> 255``, not
    clipped to white), grey-scale, palette, CMYK and alpha images become RGB.

    Raises:
        DatasetError: the file is missing or is not a readable image (the message names it).
    """
    with _decoding(path), open_image(path) as im:
        return rgb_of(im)


def _size(name: str, value: Optional[int], default: int) -> int:
    """``value`` (``None``: ``default``) as a positive whole number of pixels, else a :class:`UsageError`."""
    size = default if value is None else value
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size <= 0:
        raise UsageError(f"{name} must be a positive whole number of pixels, got {value!r}")
    return int(size)


def _real(value: Any) -> bool:
    """Whether ``value`` is a finite real number (a bool is not one)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _augmentation(scale_range: Any, jitter: Any, base_size: int) -> Tuple[float, float]:
    """``scale_range`` checked with ``jitter`` (train-mode options, checked in every mode): a :class:`UsageError`
    unless ``0 < min <= max`` (``min x base_size`` >= 1 pixel) and ``jitter`` is ``None`` or a number ``>= 0``."""
    low, high = scale_range if isinstance(scale_range, (list, tuple)) and len(scale_range) == 2 else (0, 0)
    if not (_real(low) and _real(high) and 0 < low <= high and int(low * base_size) >= 1):
        raise UsageError(f"scale_range must be two numbers 0 < min <= max, min x base_size {base_size} at least 1 "
                         f"pixel; got {scale_range!r}")
    if jitter is not None and not (_real(jitter) and jitter >= 0):
        raise UsageError(f"jitter must be a number >= 0 (None or 0: off), got {jitter!r}")
    return float(low), float(high)


def _image_step(transform: Optional[Callable], mean: Sequence[float], std: Sequence[float]) -> Callable:
    """The image-only transform: ``transform``, or the default normalising by ``mean`` / ``std``; both at once is a
    :class:`UsageError` (the pair would be silently ignored)."""
    if transform is None:
        return image_transform(mean, std)
    if tuple(mean) != tuple(IMAGENET_MEAN) or tuple(std) != tuple(IMAGENET_STD):
        raise UsageError(f"mean={tuple(mean)} / std={tuple(std)} set the default image transform's normalisation, "
                         "which transform= replaces: normalise inside transform= or drop mean/std")
    return user_transform(transform)


class BaseDataset(Dataset):
    """Base class of every segmentation dataset.

    Args:
        root: data root (default: :func:`default_root`, i.e. ``$ENCODING_DATA`` or ``~/.encoding/data``).
        split: which sample list (``train``, ``val``, ... -- see each dataset's ``SPLITS``).
        mode: ``train``, ``val``, ``testval`` or ``test``; default ``train`` for training splits, ``test`` for the
            ``test`` split, ``val`` otherwise.
        transform: image-only transform applied after the geometric ones; it receives a ``uint8``
            ``3 x H x W`` :class:`tv_tensors.Image` (a torchvision v1 pipeline with ``ToTensor``, PyTorch-Encoding's,
            a PIL image). Default: scale to ``[0, 1]`` and normalise with the ImageNet mean/std (``mean``/``std``
            arguments).
        target_transform: applied to the final ``int64`` mask.
        base_size: reference long side for the training scale jitter (``None``: the class's ``BASE_SIZE``).
        crop_size: training / validation crop (``None``: the class's ``CROP_SIZE``).
        scale_range: relative range of the training long side (default: the class's ``SCALE_RANGE``,
            PyTorch-Encoding's ``(0.5, 2.0)`` for the real datasets).
        jitter: photometric jitter strength in training (``None``/0: off). ``scale_range`` and ``jitter`` act in
            ``train`` mode alone; every mode checks them (and the sizes: positive whole numbers, ``0 < min <= max``).
        val_crop: ``val`` mode resizes + centre-crops (``True``) or returns the whole image (``False``).
        return_name: also return the image file name (``(image, mask, name)``); ``test`` mode always does.
        skip_bad: skip unusable samples with a warning (counted in ``num_skipped``) instead of raising: in training
            the next sample stands in; a scoring mode drops them when built (:meth:`verify`): none is scored twice.
        mean, std: normalisation of the default image transform (refused with ``transform=``, which replaces it).

    Returns from ``__getitem__``:
        ``(image, mask)``: ``float32 3 x H x W`` and ``int64 H x W`` with ``-1`` = ignore; ``(image, name)`` in ``test``
        mode.
    """

    NAME: ClassVar[str] = ""
    NUM_CLASS: ClassVar[int] = 0
    CLASSES: ClassVar[Tuple[str, ...]] = ()
    SPLITS: ClassVar[Tuple[str, ...]] = ("train", "val")
    #: Folder of the dataset under the data root ("" = the root itself).
    BASE_DIR: ClassVar[str] = ""
    BASE_SIZE: ClassVar[int] = 520
    CROP_SIZE: ClassVar[int] = 480
    SCALE_RANGE: ClassVar[Tuple[float, float]] = (0.5, 2.0)
    #: One ``(r, g, b)`` per class (``None``: a user dataset without colours) and the colour of ignored pixels.
    PALETTE: ClassVar[Optional[Tuple[Tuple[int, int, int], ...]]] = None
    IGNORE_COLOR: ClassVar[Tuple[int, int, int]] = (0, 0, 0)
    #: What a raw value beyond the 256 of the label table (a 16-bit mask's 300) maps to: invalid (refused), or
    #: ignore for a dataset that ignores values of no class.
    UNKNOWN_LABEL: ClassVar[int] = INVALID_LABEL
    #: The script that downloads and lays out this dataset (default: ``scripts/prepare_<NAME>.py``).
    PREPARE_SCRIPT: ClassVar[str] = ""
    #: Whether caches about the data (label counts) may be written into :attr:`dataset_dir` (false: a user's folder,
    #: never written; they go to the user's cache folder).
    WRITES_BESIDE_DATA: ClassVar[bool] = True

    def __init__(self, root: Optional[str] = None, split: str = "train", mode: Optional[str] = None,
                 transform: Optional[Callable] = None, target_transform: Optional[Callable] = None,
                 base_size: Optional[int] = None, crop_size: Optional[int] = None, *,
                 scale_range: Optional[Tuple[float, float]] = None, jitter: Optional[float] = None,
                 val_crop: bool = True, return_name: bool = False, skip_bad: bool = False,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> None:
        if split not in self.SPLITS:
            raise ValueError(f"{type(self).__name__}: unknown split {split!r}; valid splits: {', '.join(self.SPLITS)}")
        mode = mode or ("train" if split.startswith("train") else "test" if split == "test" else "val")
        if mode not in MODES:
            raise ValueError(f"{type(self).__name__}: unknown mode {mode!r}; valid modes: {', '.join(MODES)}")
        self.root = os.path.abspath(os.path.expanduser(root if root is not None else default_root()))
        self.split, self.mode = split, mode
        self.base_size = _size("base_size", base_size, self.BASE_SIZE)
        self.crop_size = _size("crop_size", crop_size, self.CROP_SIZE)
        scale_range = _augmentation(self.SCALE_RANGE if scale_range is None else scale_range, jitter, self.base_size)
        self.transform = _image_step(transform, mean, std)
        self.target_transform = target_transform
        self.return_name, self.skip_bad = return_name, skip_bad
        self._dropped, self._found = 0, None  # bad samples dropped; found while loading (shared by the workers)
        self.skipped: List[Tuple[str, str]] = []
        self._bad: set = set()
        self._table = self.label_table()
        if mode == "train":
            self._joint = train_joint_transform(self.base_size, self.crop_size, scale_range, jitter=jitter)
            self._pad = LeanCompose([PadTo(self.crop_size)])
        else:
            self._joint = val_joint_transform(self.crop_size) if mode == "val" and val_crop else None
            self._pad = None
        self._check_root()
        images, masks = self._find_samples()
        if masks is None and mode != "test":
            raise DatasetError(self.root, f"split {split!r} has no masks for mode {mode!r} (mode='test' predicts)")
        self.images, self.masks = self._drop_missing(images, None if mode == "test" else masks)
        if skip_bad and mode != "train":
            self.verify()
        if not self.images:
            raise DatasetError(self.root, f"no samples found for split {split!r}")
        self._found = torch.zeros(len(self.images), dtype=torch.bool).share_memory_() if skip_bad else None

    # ----------------------------------------------------------------------------------------------- subclass hooks
    def _check_root(self) -> None:
        """Raise a clear error when the dataset folder is absent (override to point at the prepare script)."""
        folder = self.dataset_dir
        if not os.path.isdir(folder):
            script = self.PREPARE_SCRIPT or f"scripts/prepare_{self.NAME}.py"
            raise DatasetError(folder, f"{self.NAME} dataset not found; run python {script}, or point --data-root "
                                       f"(root= in Python, or $ENCODING_DATA) at the folder holding it")

    def _prepared(self, path: str, what: str) -> str:
        """``path`` when it exists; else a :class:`DatasetError` naming it and the command that writes it.

        Args:
            path: a file or folder written at prepare time (converted masks, their lists).
            what: what it holds, for the message.
        """
        if not os.path.exists(path):
            script = os.path.basename(self.PREPARE_SCRIPT or f"scripts/prepare_{self.NAME}.py")
            command = f"python -m encoding.datasets.prepare {script[len('prepare_'):-len('.py')]}"
            raise DatasetError(path, f"{what} not found; run {command} (it converts them once)")
        return path

    @property
    def dataset_dir(self) -> str:
        """The folder holding this dataset: :attr:`root` joined with the class's ``BASE_DIR`` (if any)."""
        return os.path.join(self.root, self.BASE_DIR) if self.BASE_DIR else self.root

    def _find_samples(self) -> Tuple[List[str], Optional[List[str]]]:
        """Return the image paths and the matching mask paths (``None`` when the split has no masks)."""
        raise NotImplementedError

    def label_encoding(self) -> bytes:
        """What turns mask values into classes (the label table, and whatever else a subclass reads masks with):
        figures counted per class under another encoding are not this one's (:func:`~.class_weights.label_counts`
        keys its cache on it)."""
        return self._table.tobytes()

    def sample_name(self, index: int) -> str:
        """The name sample ``index`` goes by (a prediction's file, an error map's, a score's): its file name, as in
        PyTorch-Encoding (override where file names repeat within a split)."""
        return os.path.basename(self.images[index])

    def _read_label(self, path: str) -> np.ndarray:
        """Read a raw label file into a 2-D integer array: an index image (PNG...) as displayed, by the one mask
        reader (:func:`~.folder_meta.read_index_mask`: EXIF orientation applied, ``ImageTooLarge`` raised)."""
        return read_index_mask(path)

    @classmethod
    def label_table(cls) -> np.ndarray:
        """256-entry ``uint8`` table raw value -> class index (255 ignore, 254 invalid). Default: identity."""
        return identity_table(cls.NUM_CLASS)

    # -------------------------------------------------------------------------------------------------- properties
    @property
    def num_class(self) -> int:
        """``NUM_CLASS`` under PyTorch-Encoding's instance-attribute name (internally the count is ``nclass``)."""
        return self.NUM_CLASS

    @property
    def pred_offset(self) -> int:
        """Add this to a predicted class index to get the raw label value written in submissions."""
        return 0

    def make_pred(self, prediction: Any) -> Any:
        """Predicted class indices -> raw label values as written in submissions (PyTorch-Encoding helper)."""
        return prediction + self.pred_offset

    def __len__(self) -> int:
        return len(self.images)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(root={self.root!r}, split={self.split!r}, mode={self.mode!r}, "
                f"samples={len(self)}, base_size={self.base_size}, crop_size={self.crop_size})")

    # ------------------------------------------------------------------------------------------------------ loading
    @property
    def num_skipped(self) -> int:
        """Bad samples skipped so far, counted across DataLoader worker processes (``skipped`` lists only those of
        this process)."""
        return self._dropped + (int(self._found.sum()) if self._found is not None else 0)

    def _skip(self, path: str, problem: str, index: Optional[int] = None) -> None:
        """Warn of and count a bad sample once: dropped (``index`` ``None``), or found while loading sample
        ``index`` (not again when another worker process found it first)."""
        if index is None:
            self._dropped += 1
        elif self._found is not None:
            if bool(self._found[index]):
                return
            self._found[index] = True
        warnings.warn(f"skipping bad sample {path}: {problem}", RuntimeWarning, stacklevel=3)
        self.skipped.append((path, problem))

    def _drop_missing(self, images: List[str], masks: Optional[List[str]]) -> Tuple[List[str], Optional[List[str]]]:
        keep_images, keep_masks = [], [] if masks is not None else None
        for i, image in enumerate(images):
            missing = image if not os.path.isfile(image) else None
            if missing is None and masks is not None and not os.path.isfile(masks[i]):
                missing = masks[i]
            if missing is not None:
                kind = "image" if missing == image else "mask"
                if not self.skip_bad:
                    raise DatasetError(missing, f"{kind} file is missing")
                self._skip(missing, f"{kind} file is missing")
                continue
            keep_images.append(image)
            if keep_masks is not None:
                keep_masks.append(masks[i])
        return keep_images, keep_masks

    @staticmethod
    def _read_image(path: str) -> tv_tensors.Image:
        return tv_tensors.Image(torch.from_numpy(read_rgb(path)).permute(2, 0, 1))

    def label_map(self, index: int) -> np.ndarray:
        """Sample ``index``'s mask as checked class indices at full size (``uint8`` ``H x W``, 255 = ignore)."""
        return self._classes(self.masks[index])

    def _classes(self, path: str) -> np.ndarray:
        """The mask ``path`` as checked class indices: :meth:`_read_label`'s values through the label table
        (:func:`~.labels.table_classes`; override for masks that hold more than index values)."""
        return table_classes(self._read_label(path), self._table, self.NUM_CLASS, path, self.UNKNOWN_LABEL)

    def _load_mask(self, index: int, image_size: Tuple[int, int]) -> tv_tensors.Mask:
        mapped = self.label_map(index)
        if tuple(mapped.shape) != tuple(image_size):
            raise DatasetError(self.masks[index], f"mask size {mapped.shape[1]}x{mapped.shape[0]} (WxH) differs "
                               f"from its image {self.images[index]} ({image_size[1]}x{image_size[0]})")
        return tv_tensors.Mask(torch.from_numpy(mapped))

    def _load(self, index: int) -> tuple:
        name = self.sample_name(index)
        image = self._read_image(self.images[index])
        if self.mode == "test":
            return self.transform(image).as_subclass(Tensor), name
        mask = self._load_mask(index, tuple(image.shape[-2:]))
        image, mask = transform_pair(image, mask, self._joint, self.transform, self._pad)
        mask = to_index_mask(mask)
        if self.target_transform is not None:
            mask = self.target_transform(mask)
        image = image.as_subclass(Tensor) if isinstance(image, Tensor) else image
        return (image, mask, name) if self.return_name else (image, mask)

    def __getitem__(self, index: int) -> tuple:
        if not self.skip_bad:
            return self._load(index)
        for step in range(len(self)):
            i = (index + step) % len(self)
            if i in self._bad:
                continue
            try:
                return self._load(i)
            except DatasetError as e:
                self._bad.add(i)
                self._skip(e.path, e.problem, i)
        raise DatasetError(self.root, f"every sample of split {self.split!r} is unusable")

    def verify(self) -> int:
        """Load every sample once (without augmentation) to find bad files early.

        Returns:
            The number of bad samples (each raises :class:`DatasetError` unless ``skip_bad``, which drops them).
        """
        bad = []
        for i in range(len(self)):
            try:
                image = self._read_image(self.images[i])
                if self.masks is not None:
                    self._load_mask(i, tuple(image.shape[-2:]))
            except DatasetError as e:
                if not self.skip_bad:
                    raise
                found = self._found is not None and bool(self._found[i])  # counted when it was loaded
                self._dropped += found
                if not found:
                    self._skip(e.path, e.problem)
                bad.append(i)
        for i in reversed(bad):
            del self.images[i]
            if self.masks is not None:
                del self.masks[i]
        if self._found is not None:
            kept = torch.ones(len(self._found), dtype=torch.bool)
            kept[bad] = False
            self._found = self._found[kept].clone().share_memory_()
        self._bad.clear()
        return len(bad)
