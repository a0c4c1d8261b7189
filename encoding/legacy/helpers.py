"""PyTorch-Encoding's small helpers: ``get_mask_pallete`` (on :func:`~encoding.utils.colorize`), ``mkdir`` and
``check_sha1`` (on :mod:`encoding.utils.files`), ``test_batchify_fn`` (its ``test.py``'s collate function),
``load_image`` (its ``utils/presets.py``: the demos' reader, on :func:`~encoding.datasets.base.read_rgb`).

Each is declared in ``encoding.utils`` (and its ``palette`` / ``files`` submodule) beside its definition.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional, Tuple, Union

import numpy as np
import torch
from PIL import Image

from .. import datasets
from ..datasets.base import ShiftedLabels, read_rgb
from ..datasets.transforms import image_transform

from ..utils.files import check_checksum, makedirs
from ..utils.palette import PaletteLike, colorize, voc_palette
from .declare import PEERS, old_module, old_name

__all__ = ["get_mask_pallete", "mkdir", "check_sha1", "test_batchify_fn", "load_image"]


old_module("encoding.utils.pallete", "encoding.utils.palette", why=PEERS)  # PE's spelling of the module


@old_name("encoding.utils", "encoding.utils.palette", "encoding.utils.pallete", new="encoding.utils.colorize",
          star=("encoding.utils.pallete",))
def get_mask_pallete(npimg: Any, dataset: PaletteLike = "detail") -> Image.Image:
    """PyTorch-Encoding's name (and spelling) for :func:`encoding.utils.colorize`, on what its ``test.py`` hands it:
    ``make_pred``'s raw values. For ADE20K and PASCAL-Context (class ``k`` stored as ``k + 1``) the pixel values stay
    the raw ones a submission holds and the palette is indexed by them (0, "other", and 255: the ignore colour); Pascal
    VOC's 21 is its boundary (ignored). PE's default ``"detail"`` is PE's rendering: the values (as ``uint8``) with
    the 256-colour VOC map, whatever they are. The input is never modified."""
    values = np.array(npimg)
    if isinstance(dataset, str) and dataset == "detail":
        return _raw_image(values, np.array(voc_palette(256), dtype=np.uint8))
    if isinstance(dataset, str) and dataset == "pascal_voc":
        values[values == 21] = 255
    cls = datasets.datasets.get(dataset) if isinstance(dataset, str) else None
    if cls is None or not issubclass(cls, ShiftedLabels):
        return colorize(values, dataset)
    shown = colorize(np.where((values == 0) | (values == 255), -1, values - 1), dataset)  # checked; its colours
    table = np.array(shown.getpalette()[:768], dtype=np.uint8).reshape(256, 3)
    raw = np.concatenate([table[255:], table[:255]])  # raw value v -> class v - 1; 0 (and 255) -> the ignore colour
    raw[255] = table[255]
    return _raw_image(values, raw)


def _raw_image(values: np.ndarray, table: np.ndarray) -> Image.Image:
    """A ``"P"`` image of ``HxW`` (or ``1xHxW``) ``values`` as ``uint8`` (PE's ``Image.fromarray(npimg.squeeze()
    .astype('uint8'))``) with the ``256 x 3`` colour ``table``.

    Raises:
        ValueError: ``values`` is not ``HxW`` once leading 1-dimensions are dropped.
    """
    while values.ndim > 2 and values.shape[0] == 1:
        values = values[0]
    if values.ndim != 2:
        raise ValueError(f"a mask must be HxW (or 1xHxW), got shape {values.shape}")
    pixels = np.ascontiguousarray(values.astype(np.uint8))
    image = Image.frombytes("P", (pixels.shape[1], pixels.shape[0]), pixels.tobytes())
    image.putpalette(table.ravel().tolist())
    return image


@old_name("encoding.utils", "encoding.utils.files", new="encoding.utils.files.makedirs")
def mkdir(path: str) -> str:
    """PyTorch-Encoding's name of :func:`encoding.utils.files.makedirs`."""
    return makedirs(path)


@old_name("encoding.utils", "encoding.utils.files",
          new='encoding.utils.files.check_checksum(filename, "sha1:" + sha1_hash)')
def check_sha1(filename: str, sha1_hash: str) -> bool:
    """PyTorch-Encoding helper: whether ``filename`` has the given SHA-1 (see ``files.check_checksum``)."""
    return check_checksum(filename, "sha1:" + sha1_hash)


@old_name("encoding.datasets", new="encoding.datasets.list_collate")
def test_batchify_fn(data: Any) -> Any:
    """PyTorch-Encoding's ``collate_fn`` of its ``test.py``: samples of different sizes as lists (``[(image, name),
    ...]`` -> ``[[images], [names]]``), nothing stacked."""
    if isinstance(data[0], (str, torch.Tensor)):
        return list(data)
    if isinstance(data[0], (tuple, list)):
        return [test_batchify_fn.__wrapped__(field) for field in zip(*data)]
    raise TypeError(f"batch must contain tensors, tuples or lists; found {type(data[0]).__name__}")


#: ``load_image``'s default transform: the datasets' (``uint8`` -> ``[0, 1]`` -> ImageNet mean / std), PE's
#: ``Compose([ToTensor(), Normalize([.485, .456, .406], [.229, .224, .225])])``.
DEFAULT_TRANSFORM = image_transform()


def _demo_size(width: int, height: int, size: Optional[int], scale: Optional[float],
               keep_asp: bool) -> Tuple[int, int]:
    """``load_image``'s target ``(width, height)``, PE's rule: ``size`` wide (and ``size`` high without
    ``keep_asp``), else the size divided by ``scale``, else unchanged."""
    if size is not None:
        return (size, int(size * 1.0 / width * height)) if keep_asp else (size, size)
    if scale is not None:
        return int(width / scale), int(height / scale)
    return width, height


@old_name("encoding.utils")
def load_image(filename: Union[str, os.PathLike], size: Optional[int] = None, scale: Optional[float] = None,
               keep_asp: bool = True, transform: Optional[Callable] = DEFAULT_TRANSFORM) -> Any:
    """Read an image for a demo (PyTorch-Encoding's ``load_image``): RGB, optionally resized, then transformed.

    Args:
        filename: the image file (read as the datasets read it: pixel limit checked first, EXIF-upright, RGB).
        size: resize to this width, the height following the aspect ratio (``keep_asp``) or equal to ``size``.
        scale: without ``size``, divide both sides by ``scale``. Resizing is Lanczos (PE's ``ANTIALIAS``).
        keep_asp: keep the aspect ratio when ``size`` is given.
        transform: applied to the PIL image (PE's contract: a torchvision pipeline starting with ``ToTensor``);
            the default normalises as the datasets do; ``None`` returns the PIL image.

    Returns:
        The transformed image: with the default a ``float32`` ``3 x H x W`` tensor (no batch dimension, as PE's;
        ``.unsqueeze(0)`` for a model).

    Raises:
        DatasetError: the file is missing or not a readable image (the message names it).
        ImageTooLarge: the image is over the pixel limit (named, nothing decoded).
        ValueError: ``size`` / ``scale`` give an empty image (the message names the file).
    """
    path = os.fspath(filename)
    rgb = read_rgb(path)
    height, width = rgb.shape[:2]
    target = _demo_size(width, height, size, scale, keep_asp)
    if min(target) < 1:
        raise ValueError(f"{path}: size={size}, scale={scale} resize the {width} x {height} image to {target}")
    image = Image.fromarray(rgb)
    if target != (width, height):
        image = image.resize(target, Image.Resampling.LANCZOS)
    if transform is DEFAULT_TRANSFORM:
        return transform(torch.from_numpy(np.array(image)).permute(2, 0, 1))
    return transform(image) if transform else image
