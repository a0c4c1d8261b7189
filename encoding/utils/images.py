"""The pixel limit of every image the toolkit decodes, checked from the file's header before decoding.

A PNG of 150 KB may hold 13000 x 13000 pixels: decoded, it costs hundreds of MiB (and several GiB once converted to
floats). Every reader of an image a user or a visitor hands us (the datasets and their scan, ``segment``,
``demo.py``, ``test.py``, the web page) opens it with :func:`open_image`, which reads the size from the header and
refuses, in one line naming the file, an image of more than :func:`max_pixels` pixels, before a byte of pixels is
decoded.

The limit is :data:`DEFAULT_MAX_PIXELS` (100 megapixels: a 108-megapixel phone photo is refused, a 4K frame or a
50-megapixel camera photo is read), raised or lowered by the environment variable ``ENCODING_MAX_PIXELS``, by
:func:`set_max_pixels` (the scripts' ``--max-pixels``), or per call (``limit=``). Pillow's own decompression-bomb
check stays in force on top of it.

The orientation rule is here too, for every reader (the loader, the scan): a file is read as it is displayed, its
EXIF (or XMP) orientation applied (:func:`upright`); :func:`upright_size` is the size that rule gives, from the
header alone.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional, Union

import numpy as np

from PIL import Image, UnidentifiedImageError

from ..errors import UsageError

__all__ = ["DEFAULT_MAX_PIXELS", "READ_FORMATS", "ImageTooLarge", "max_pixels", "set_max_pixels", "check_pixels",
           "image_extensions", "open_image", "orientation", "upright", "upright_size", "rgb_of"]

#: The default pixel limit (width x height) of an image the toolkit decodes.
DEFAULT_MAX_PIXELS = 100_000_000
_ENV = "ENCODING_MAX_PIXELS"
_limit: Optional[int] = None


class ImageTooLarge(UsageError):
    """An image has more pixels than the limit (checked from its header, before decoding); exit status 2."""


def _parse_limit(value: Union[int, str], source: str) -> int:
    try:
        limit = int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{source} must be a whole number of pixels, got {value!r}") from None
    if limit <= 0:
        raise UsageError(f"{source} must be positive, got {value!r}")
    return limit


def max_pixels() -> int:
    """The pixel limit in force: :func:`set_max_pixels`'s value, else ``ENCODING_MAX_PIXELS``, else the default."""
    if _limit is not None:
        return _limit
    value = os.environ.get(_ENV)
    return DEFAULT_MAX_PIXELS if value in (None, "") else _parse_limit(value, _ENV)


def set_max_pixels(limit: Optional[int]) -> None:
    """Set the process-wide pixel limit (``None``: back to ``ENCODING_MAX_PIXELS`` or the default).

    Raises:
        UsageError: ``limit`` is not a positive whole number.
    """
    global _limit
    _limit = None if limit is None else _parse_limit(limit, "--max-pixels")


def check_pixels(width: int, height: int, name: str, limit: Optional[int] = None) -> None:
    """Refuse a ``width x height`` image named ``name`` above ``limit`` pixels (default :func:`max_pixels`).

    Raises:
        ImageTooLarge: one line naming the image, its size, the limit and how to raise it.
    """
    limit = max_pixels() if limit is None else _parse_limit(limit, "limit")
    if int(width) * int(height) > limit:
        raise ImageTooLarge(
            f"{name}: image of {width} x {height} = {int(width) * int(height):,} pixels is over the limit of "
            f"{limit:,} pixels (checked before decoding; raise it with --max-pixels or {_ENV})")


#: The image formats read: each gives its size in a header that Pillow reads before any pixel is decoded. Others
#: are refused unopened: Pillow decodes an icon's embedded PNG (ICO, ICNS) while opening it, before its size can be
#: checked, and runs Ghostscript on EPS. (JPEG's opener reads MPO files too.)
READ_FORMATS = ("PNG", "JPEG", "BMP", "GIF", "TIFF", "WEBP", "PPM", "TGA", "JPEG2000")


def image_extensions() -> set:
    """The file extensions (lower case, with the dot) of :data:`READ_FORMATS` (and MPO), as Pillow registers them."""
    return {ext.lower() for ext, fmt in Image.registered_extensions().items() if fmt in READ_FORMATS + ("MPO",)}


@contextlib.contextmanager
def open_image(path: Union[str, os.PathLike], limit: Optional[int] = None) -> Iterator[Image.Image]:
    """``Image.open(path)`` of one of :data:`READ_FORMATS`, whose size, read from the header, is checked by
    :func:`check_pixels` before use.

    Raises:
        ImageTooLarge: the image has more pixels than the limit (nothing was decoded).
        OSError: as ``Image.open`` (missing or unreadable file; ``PIL.UnidentifiedImageError`` naming the formats
            read for a file of another format).
    """
    try:
        opened = Image.open(path, formats=READ_FORMATS)
    except UnidentifiedImageError:
        raise UnidentifiedImageError(f"{os.fspath(path)}: not an image of a format read here "
                                     f"({', '.join(READ_FORMATS)})") from None
    except Image.DecompressionBombError as err:  # Pillow's own bound, from the header: nothing decoded either
        raise ImageTooLarge(f"{os.fspath(path)}: {err} (checked before decoding)") from None
    with opened as im:
        check_pixels(im.width, im.height, os.fspath(path), limit)
        yield im


#: EXIF orientation -> the transpose that shows the image upright (as ``PIL.ImageOps.exif_transpose``).
_UPRIGHT = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
            5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
            8: Image.Transpose.ROTATE_90}


def orientation(im: Image.Image) -> int:
    """The EXIF (or XMP) orientation of an opened image, 1 (as stored) when it has none or an invalid one."""
    try:
        value = im.getexif().get(0x0112, 1)
    except Exception:  # a broken EXIF block: the image is shown as stored, as Pillow's viewers do
        return 1
    return value if value in _UPRIGHT else 1


def upright(im: Image.Image) -> Image.Image:
    """``im`` as it is displayed: its orientation applied (the same image, not a copy, when it has none)."""
    turn = _UPRIGHT.get(orientation(im))
    return im if turn is None else im.transpose(turn)


def upright_size(im: Image.Image) -> tuple:
    """``(width, height)`` of ``im`` as :func:`upright` shows it, read from the header (nothing decoded)."""
    return (im.height, im.width) if orientation(im) in (5, 6, 7, 8) else (im.width, im.height)


def rgb_of(im: Image.Image) -> np.ndarray:
    """A PIL image as :func:`encoding.datasets.base.read_rgb` reads its file: upright by its EXIF orientation,
    16/32-bit grey scaled to 8 bits, any mode converted to RGB (``encoding.segment`` of a PIL image gives the labels
    of its file)."""
    im = upright(im)
    if im.mode.startswith("I") or im.mode == "F":  # 16-bit PNG / TIFF grey ("I;16", "I"), float ("F")
        wide = np.asarray(im, dtype=np.float64)
        top = 65535.0 if im.mode != "F" else 1.0 if wide.size == 0 or wide.max() <= 1.0 else 255.0
        grey = np.clip(np.rint(wide * (255.0 / top)), 0, 255).astype(np.uint8)
        return np.repeat(grey[..., None], 3, axis=2)
    return np.array(im if im.mode == "RGB" else im.convert("RGB"))
