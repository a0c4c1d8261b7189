"""PyTorch-Encoding's small helpers: ``get_mask_pallete`` (on :func:`~encoding.utils.colorize`), ``mkdir`` and
``check_sha1`` (on :mod:`encoding.utils.files`), ``test_batchify_fn`` (its ``test.py``'s collate function).

Each is declared in ``encoding.utils`` and its ``palette`` / ``files`` submodule beside its definition.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image

from .. import datasets
from ..datasets.base import ShiftedLabels

from ..utils.files import check_checksum, makedirs
from ..utils.palette import PaletteLike, colorize
from .declare import old_name

__all__ = ["get_mask_pallete", "mkdir", "check_sha1", "test_batchify_fn"]


@old_name("encoding.utils", "encoding.utils.palette", new="encoding.utils.colorize")
def get_mask_pallete(npimg: Any, dataset: PaletteLike = "detail") -> Image.Image:
    """PyTorch-Encoding's name (and spelling) for :func:`encoding.utils.colorize`, on what its ``test.py`` hands it:
    ``make_pred``'s raw values. For ADE20K and PASCAL-Context (class ``k`` stored as ``k + 1``) the pixel values stay
    the raw ones a submission holds and the palette is indexed by them (0, "other", and 255: the ignore colour); Pascal
    VOC's 21 is its boundary (ignored). The input is never modified."""
    values = np.array(npimg)
    if isinstance(dataset, str) and dataset == "pascal_voc":
        values[values == 21] = 255
    cls = datasets.datasets.get(dataset) if isinstance(dataset, str) else None
    if cls is None or not issubclass(cls, ShiftedLabels):
        return colorize(values, dataset)
    shown = colorize(np.where((values == 0) | (values == 255), -1, values - 1), dataset)  # checked; its colours
    table = np.array(shown.getpalette()[:768], dtype=np.uint8).reshape(256, 3)
    raw = np.concatenate([table[255:], table[:255]])  # raw value v -> class v - 1; 0 (and 255) -> the ignore colour
    raw[255] = table[255]
    image = Image.frombytes("P", shown.size, np.ascontiguousarray(values.squeeze().astype(np.uint8)).tobytes())
    image.putpalette(raw.ravel().tolist())
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
