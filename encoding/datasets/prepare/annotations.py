"""What an annotation file (PASCAL-Context's or COCO's JSON) declares about an image, checked before it is used.

An annotation file is data: an image's ``file_name`` names the mask written for it only when it is a plain file name
(no folder, no ``..``, not absolute), so nothing is written outside the dataset's folder; and its declared height
and width are positive whole numbers within the toolkit's pixel limit
(:func:`encoding.utils.images.max_pixels`, ``ENCODING_MAX_PIXELS``) before an array is allocated for it. Each refusal
is one :class:`~encoding.datasets.layout.DatasetError` naming the annotation file and the image.

A conversion's masks and split lists are one unit (:func:`staged_conversion`): a marker written last says the unit is
complete (:func:`converted`), so a run interrupted anywhere is redone by the next, never half trusted.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, Iterator, Mapping, Sequence, Tuple

from ...utils.files import atomic_write, staged_dir
from ...utils.images import ImageTooLarge, check_pixels
from ..layout import DatasetError

__all__ = ["mask_stem", "image_shape", "check_rle_size", "done_marker", "converted", "staged_conversion"]

_SEPARATORS = tuple({"/", "\\", os.sep, os.altsep} - {None})


def mask_stem(file_name: Any, source: str) -> str:
    """The stem of an image's ``file_name`` (``2008_000002`` for ``2008_000002.jpg``), the name of its mask.

    Args:
        file_name: the ``file_name`` the annotation file gives.
        source: the annotation file (named by the error).

    Raises:
        DatasetError: not a plain file name: not a string, empty, ``.`` or ``..``, absolute, or holding a separator.
    """
    stem = os.path.splitext(file_name)[0] if isinstance(file_name, str) else ""
    if stem in ("", ".", "..") or "\0" in file_name or os.path.isabs(file_name) or \
            any(sep in file_name for sep in _SEPARATORS):
        raise DatasetError(source, f"image file_name {file_name!r} is not a plain file name (its mask would be "
                                   "written outside the dataset folder)")
    return stem


def _side(image: Mapping[str, Any], key: str, source: str) -> int:
    value = image.get(key)
    if type(value) is not int or value <= 0:
        raise DatasetError(source, f"image {image.get('file_name')!r}: {key} must be a positive whole number, "
                                   f"got {value!r}")
    return value


def image_shape(image: Mapping[str, Any], source: str) -> Tuple[int, int]:
    """``(height, width)`` of an image record of an annotation file, checked before a mask is allocated.

    Raises:
        DatasetError: a side missing, not a positive whole number, or more pixels than the limit.
    """
    height, width = _side(image, "height", source), _side(image, "width", source)
    try:
        check_pixels(width, height, f"image {image.get('file_name')!r}")
    except ImageTooLarge as e:
        raise DatasetError(source, str(e)) from None
    return height, width


def check_rle_size(ann: Mapping[str, Any], shape: Tuple[int, ...]) -> None:
    """An RLE segmentation (a dict) carries its own size: it must be its image's ``shape``, checked before it is
    decoded (polygons, lists, carry none).

    Raises:
        ValueError: another size (the converters turn it into a :class:`DatasetError` naming the file).
    """
    segmentation = ann.get("segmentation")
    if isinstance(segmentation, dict) and tuple(int(v) for v in segmentation.get("size", ())) != tuple(shape):
        raise ValueError(f"annotation {ann.get('id')} has size {segmentation.get('size')}, image is {tuple(shape)}")


def done_marker(mask_dir: str) -> str:
    """The file a conversion into ``mask_dir`` writes last, beside it (``.<name>.complete``)."""
    return os.path.join(os.path.dirname(mask_dir), f".{os.path.basename(mask_dir)}.complete")


def converted(mask_dir: str, lists: Sequence[str]) -> bool:
    """Whether a conversion into ``mask_dir`` with the list files ``lists`` finished: its marker, its masks and its
    lists are all there (one of an earlier release, which wrote no marker, is converted again)."""
    return os.path.isfile(done_marker(mask_dir)) and os.path.isdir(mask_dir) and all(map(os.path.isfile, lists))


@contextlib.contextmanager
def staged_conversion(mask_dir: str) -> Iterator[Tuple[str, Dict[str, str]]]:
    """Masks and their split lists written as one unit.

    Yields ``(staging, lists)``: the block saves the masks into the staging folder and sets ``lists[path] = text``
    for each list file. When it succeeds, the marker and the old list files are removed, the masks are swapped in
    (:func:`~encoding.utils.files.staged_dir`), the lists written, and the marker (:func:`done_marker`) last; when it
    fails, the old conversion stays whole. An interruption after the block leaves no marker: the next run converts
    again, and a dataset never reads new lists over old masks (nor old lists over new ones).
    """
    lists: Dict[str, str] = {}
    with staged_dir(mask_dir, replace=True) as staging:
        yield staging, lists
        for path in [done_marker(mask_dir), *lists]:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    for path, text in lists.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write(path, text)
    atomic_write(done_marker(mask_dir), "".join(os.path.basename(path) + "\n" for path in lists))
