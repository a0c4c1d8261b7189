"""PyTorch-Encoding's small helpers: ``get_mask_pallete`` (on :func:`~encoding.utils.colorize`), ``mkdir`` and
``check_sha1`` (on :mod:`encoding.utils.files`).

Each is declared in ``encoding.utils`` and its ``palette`` / ``files`` submodule beside its definition.
"""
from __future__ import annotations

from typing import Any

from PIL import Image

from ..utils.files import check_checksum, makedirs
from ..utils.palette import PaletteLike, colorize
from .declare import old_name

__all__ = ["get_mask_pallete", "mkdir", "check_sha1"]


@old_name("encoding.utils", "encoding.utils.palette", new="encoding.utils.colorize")
def get_mask_pallete(npimg: Any, dataset: PaletteLike = "detail") -> Image.Image:
    """PyTorch-Encoding's name (and spelling) for :func:`encoding.utils.colorize`; the input is never modified."""
    return colorize(npimg, dataset)


@old_name("encoding.utils", "encoding.utils.files", new="encoding.utils.files.makedirs")
def mkdir(path: str) -> str:
    """PyTorch-Encoding's name of :func:`encoding.utils.files.makedirs`."""
    return makedirs(path)


@old_name("encoding.utils", "encoding.utils.files",
          new='encoding.utils.files.check_checksum(filename, "sha1:" + sha1_hash)')
def check_sha1(filename: str, sha1_hash: str) -> bool:
    """PyTorch-Encoding helper: whether ``filename`` has the given SHA-1 (see ``files.check_checksum``)."""
    return check_checksum(filename, "sha1:" + sha1_hash)
