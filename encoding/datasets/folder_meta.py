"""The classes of a folder dataset and how its masks encode them: ``classes.{yaml,json,txt}`` and the mask reader.

A class file names the classes in id order and may give their colours and the ignore value::

    # classes.yaml (or the same structure in classes.json)
    classes: [background, cat, dog]            # or [{name: cat, color: [255, 0, 0]}, ...]
    colors: [[0, 0, 0], [255, 0, 0], [0, 0, 255]]   # optional (also "palette")
    ignore_index: 255                           # optional, the default
    ignore_color: [255, 255, 255]               # optional: the ignore colour of RGB masks
    reduce_zero_label: true                     # optional (mmseg's): index value 0 is ignored, class k is k + 1

    # classes.txt: one class per line, optionally followed by its colour ("cat 255 0 0"); a line
    # "reduce_zero_label: true" sets that key

Masks are index images (mode ``L`` / ``P`` / 16-bit, or RGB whose three channels are equal) holding class ids, or
RGB colour-coded masks (CVAT / LabelMe / Label Studio exports) mapped through the class file's colours. Without a
class file the class count comes from the scan of the masks (the largest value + 1, names ``class_0 ...``), and
masks that hold only 0 and 255 are binary masks (255 = foreground).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from ..utils.images import ImageTooLarge, open_image, upright
from .class_text import MAX_CLASS_FILE, load_yaml, read_text
from .layout import DatasetError

__all__ = ["CLASS_FILES", "MAX_CLASS_FILE", "MAX_CLASSES", "LOSSY_FORMATS", "ClassSpec", "TransparentMask",
           "read_class_file", "read_mask", "read_index_mask", "grey_index", "mask_histogram", "pack_colors",
           "color_lookup", "format_colors"]


#: The class files looked for in a folder dataset's root, in this order.
CLASS_FILES = ("classes.yaml", "classes.yml", "classes.json", "classes.txt")
RGB = Tuple[int, int, int]
#: A line of a classes.txt that starts with its class id: ``0 background``, ``1: cat 255 0 0``.
_NUMBERED = re.compile(r"(\d{1,4})(?:\s*[:,=]\s*|\s+)(\S.*)")
#: The one key line of a classes.txt: ``reduce_zero_label: true``.
_REDUCE = re.compile(r"reduce_zero_label\s*[:=]\s*(true|false)", re.IGNORECASE)
#: Mask formats that alter values when saved (masks must be lossless: PNG, TIFF, BMP, ...); a WebP or TIFF mask is
#: lossy where its file says so (:func:`_lossy`).
LOSSY_FORMATS = ("JPEG", "MPO", "JPEG2000", "AVIF", "HEIF")
_INDEX_MODES = ("L", "P", "I", "I;16", "I;16L", "I;16B", "1")
#: The bound of a class file's number of classes (ids 0..253, 255 = ignore); of its size: MAX_CLASS_FILE.
MAX_CLASSES = 254
#: The scan counts a mask's values in pieces of this many pixels; a mask with more distinct values is no mask.
PIECE_PIXELS = 1 << 20
MAX_MASK_VALUES = 4096


@dataclass(frozen=True)
class ClassSpec:
    """The classes of a dataset: names in id order, optional colours, the raw ignore value and ignore colour;
    ``reduce_zero_label``: index masks hold class ``k`` as ``k + 1`` and 0 is ignored (mmsegmentation's key)."""

    names: Tuple[str, ...]
    colors: Optional[Tuple[RGB, ...]] = None
    ignore_index: int = 255
    ignore_color: Optional[RGB] = None
    source: str = ""
    reduce_zero_label: bool = False

    @property
    def first_value(self) -> int:
        """The index-mask value of class 0: 1 with ``reduce_zero_label`` (0 then ignored), else 0."""
        return int(self.reduce_zero_label)


def _color(value: Any, where: str) -> RGB:
    if isinstance(value, str):
        value = [v for v in re.split(r"[\s,]+", value.strip().lstrip("#")) if v]
    try:
        rgb = tuple(_whole(v) for v in value)
    except (TypeError, ValueError):
        rgb = ()
    if len(rgb) != 3 or not all(0 <= v <= 255 for v in rgb):
        raise DatasetError(where, f"colour {_short(value)} is not an (r, g, b) triple of 0..255")
    return rgb  # type: ignore[return-value]


def _whole(value: Any) -> int:
    """A whole number of a class file (an int or digits), never a bool (YAML's ``true`` / ``yes``)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(value)
    return int(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _name(item: Any, path: str) -> str:
    """A class name: text (a number is taken as its text), one line; YAML's ``yes`` / ``no`` / ``null`` are not."""
    if isinstance(item, bool) or item is None or not isinstance(item, (str, int, float)):
        raise DatasetError(path, f"class name {_short(item)} is not text (quote it: \"{item}\")" if isinstance(
            item, bool) or item is None else f"class name {_short(item)} is not text")
    name = str(item).strip()
    if not name or not name.isprintable():
        raise DatasetError(path, f"class name {_short(item)} is empty or holds control characters")
    return name


def _from_mapping(data: Any, path: str) -> ClassSpec:
    if isinstance(data, list):
        data = {"classes": data}
    if not isinstance(data, dict) or not isinstance(data.get("classes"), list) or not data["classes"]:
        raise DatasetError(path, "expected a list of class names, or a mapping with a non-empty 'classes' list")
    _check_count(len(data["classes"]), path)
    names, colors = [], []
    for item in data["classes"]:
        if isinstance(item, dict):
            if "name" not in item:
                raise DatasetError(path, f"class entry {_short(item)} has no 'name'")
            names.append(_name(item["name"], path))
            if "color" in item or "colour" in item:
                colors.append(_color(item.get("color", item.get("colour")), path))
        else:
            names.append(_name(item, path))
    given = data.get("colors", data.get("colours", data.get("palette")))
    if given is not None:
        if not isinstance(given, list):
            raise DatasetError(path, f"colors must be a list of (r, g, b) triples, got {_short(given)}")
        _check_count(len(given), path)
        colors = [_color(c, path) for c in given]
    ignore = data.get("ignore_index", data.get("ignore", 255))
    ignore_color = data.get("ignore_color", data.get("ignore_colour"))
    reduce = data.get("reduce_zero_label", False)
    if not isinstance(reduce, bool):
        raise DatasetError(path, f"reduce_zero_label must be true or false, got {_short(reduce)}")
    return _spec(names, colors, ignore, None if ignore_color is None else _color(ignore_color, path), path, reduce)


def _from_text(text: str, path: str) -> ClassSpec:
    """One class per line (``name [r g b]``), in id order; lines that all start with the id (``0 background``,
    ``1: cat``) are put in its order, the ids being the mask values ``0..n-1`` (``1..n`` with a line
    ``reduce_zero_label: true``) each once."""
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    keys = [_REDUCE.fullmatch(ln) for ln in lines]
    reduce = any(k is not None and k.group(1).lower() == "true" for k in keys)
    lines = [ln for ln, k in zip(lines, keys) if ln and k is None]
    numbered = [_NUMBERED.match(ln) for ln in lines]
    if not lines or not all(numbered):
        numbered = []
    elif sorted(int(m.group(1)) for m in numbered) != list(range(reduce, len(lines) + reduce)):
        raise DatasetError(path, f"numbers its classes {[int(m.group(1)) for m in numbered][:10]}: the numbers must "
                                 f"be the mask values {int(reduce)}..{len(lines) - 1 + reduce}, each once (255 = "
                                 "unlabelled, not listed)")
    names, colors = [], []
    for line in [m.group(2) for m in sorted(numbered, key=lambda m: int(m.group(1)))] or lines:
        parts = re.split(r"[\s,]+", line)
        if len(parts) >= 4 and all(p.isdigit() for p in parts[-3:]):
            names.append(_name(" ".join(parts[:-3]), path))
            colors.append(_color(parts[-3:], path))
        else:
            names.append(_name(line, path))
        _check_count(len(names), path)
    return _spec(names, colors, 255, None, path, reduce)


def _check_count(count: int, path: str) -> None:
    if count > MAX_CLASSES:
        raise DatasetError(path, f"names {count if count <= 10 * MAX_CLASSES else 'more than ' + str(count)} "
                                 f"classes: at most {MAX_CLASSES} (mask values 0..{MAX_CLASSES - 1}, 255 = ignore)")


def _spec(names: List[str], colors: List[RGB], ignore: Any, ignore_color: Optional[RGB], path: str,
          reduce: bool = False) -> ClassSpec:
    if not names:
        raise DatasetError(path, "names no class")
    repeated = sorted(n for n, k in Counter(names).items() if k > 1)
    if repeated:
        raise DatasetError(path, f"class names repeat: {repeated[:10]}")
    if colors and len(colors) != len(names):
        raise DatasetError(path, f"gives {len(colors)} colours for {len(names)} classes (one per class, or none)")
    if colors and len(set(colors)) != len(colors):
        raise DatasetError(path, "two classes have the same colour")
    if ignore_color is not None and ignore_color in colors:
        raise DatasetError(path, f"ignore_color {list(ignore_color)} is the colour of class "
                                 f"{names[colors.index(ignore_color)]!r}: its pixels would be ignored")
    if type(ignore) is not int or not len(names) + reduce <= ignore <= 255:  # noqa: E721 (a bool is no value)
        hint = "; if 0 means unlabelled, add reduce_zero_label: true (0 ignored, class k stored as k + 1)"
        raise DatasetError(path, f"ignore_index {_short(ignore)} must be an integer in [{len(names) + reduce}, 255] "
                                 "(the mask value of unlabelled pixels, after the class ids)"
                                 + (hint if ignore == 0 and type(ignore) is int and not reduce else ""))
    return ClassSpec(tuple(names), tuple(colors) or None, ignore, ignore_color, path, reduce)


def read_class_file(root: str) -> Optional[ClassSpec]:
    """The :class:`ClassSpec` of the first of :data:`CLASS_FILES` in ``root``, or ``None`` when there is none.

    The file is read with bounds: at most :data:`MAX_CLASS_FILE` bytes of UTF-8 text, :data:`MAX_CLASSES` classes,
    no YAML aliases, names that are text, colours of three whole numbers, an integer ``ignore_index`` (a bool is
    not one); in time linear in the number of classes.

    Raises:
        DatasetError: the file cannot be read or parsed, or is inconsistent (one line naming it).
    """
    for name in CLASS_FILES:
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            continue
        text = read_text(path)
        if name.endswith(".txt"):
            return _from_text(text, path)
        try:
            data = json.loads(text) if name.endswith(".json") else load_yaml(text)
        except ImportError:
            raise DatasetError(path, "reading a YAML class file needs PyYAML (pip install pyyaml), or write "
                                     "classes.json / classes.txt") from None
        except RecursionError:
            raise DatasetError(path, "cannot parse (nested too deeply)") from None
        except Exception as err:  # json.JSONDecodeError, yaml.YAMLError
            raise DatasetError(path, f"cannot parse ({(str(err).splitlines() or [type(err).__name__])[0]})") from None
        return _from_mapping(data, path)
    return None


def pack_colors(rgb: np.ndarray) -> np.ndarray:
    """``... x 3`` uint8 colours -> one ``uint32`` per colour (``r << 16 | g << 8 | b``)."""
    rgb = rgb.astype(np.uint32)
    return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]


class TransparentMask(DatasetError):
    """An RGBA mask with transparent pixels (their colour is no label)."""


@contextlib.contextmanager
def _opened_mask(path: str, colour: bool = True) -> Iterator[Tuple[Image.Image, Image.Image]]:
    """``(mask upright, mask as stored)``: the mask ``path`` opened (size checked from the header), mode checked (the
    stored one keeps the file's format and compression, :func:`_lossy`); errors as one line. ``colour=False``: an
    index image alone is a mask."""
    try:
        with open_image(path) as im:
            if im.mode not in _INDEX_MODES + (("RGB", "RGBA") if colour else ()):
                raise DatasetError(path, f"mask has mode {im.mode}; expected an index image (mode L or P, or 16-bit)"
                                         + (" or RGB" if colour else ""))
            yield upright(im), im
    except FileNotFoundError:
        raise DatasetError(path, "mask file is missing") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        if isinstance(err, (DatasetError, ImageTooLarge)):
            raise
        raise DatasetError(path, f"cannot decode mask ({err})") from err


def _lossy(im: Image.Image, path: str) -> bool:
    """Whether the file of ``im`` holds lossily compressed pixels: one of :data:`LOSSY_FORMATS`, a TIFF of
    JPEG-compressed strips, a WebP of the lossy (VP8) bitstream (the lossless one is VP8L)."""
    if im.format in LOSSY_FORMATS:
        return True
    if im.format == "TIFF":
        return im.info.get("compression") in ("jpeg", "tiff_jpeg")
    return im.format == "WEBP" and _webp_lossy(path)


def _webp_lossy(path: str) -> bool:
    """Whether the WebP file ``path``'s first bitstream chunk is the lossy ``"VP8 "`` rather than the lossless
    ``"VP8L"`` (RIFF chunks after the 12-byte header; an animation's frames hold theirs after a 16-byte header)."""
    with open(path, "rb") as f:
        f.seek(12)
        while True:
            head = f.read(8)
            if len(head) < 8:
                return False
            fourcc, size = head[:4], int.from_bytes(head[4:], "little")
            if fourcc in (b"VP8 ", b"VP8L"):
                return fourcc == b"VP8 "
            f.seek(16 if fourcc == b"ANMF" else size + (size & 1), 1)


def _as_labels(im: Image.Image, path: str) -> Tuple[str, np.ndarray]:
    if im.mode in _INDEX_MODES:
        values = np.asarray(im)
        return "index", values.astype(np.uint8) if values.dtype == bool else values
    if im.mode == "RGBA" and np.asarray(im.getchannel("A")).min() < 255:  # a transparent pixel's colour means nothing
        raise TransparentMask(path, "mask has transparent pixels: their colour is no label (an editor's layer often "
                                    "keeps its brush colour there); flatten it onto the background colour, save as RGB")
    rgb = np.asarray(im.convert("RGB"))
    return "color", pack_colors(rgb)


def read_mask(path: str, colors: Optional[Mapping[int, int]] = None) -> Tuple[str, np.ndarray]:
    """``("index", H x W values)`` (uint8, or 16/32-bit) or ``("color", H x W packed colours)`` of a mask file, as
    displayed (:func:`~encoding.utils.images.upright`, the images' rule); an RGB mask whose channels are equal is an
    index mask unless its colours are all class colours (:func:`grey_index`, with ``colors``:
    :func:`color_lookup`'s table).

    Raises:
        DatasetError: the file is missing or unreadable, or not a mask (the message names it).
        ImageTooLarge: over the pixel limit (checked before decoding).
    """
    with _opened_mask(path) as (im, _):
        kind, values = _as_labels(im, path)
    if grey_index(kind, values, colors or {}):
        return "index", (values & 255).astype(np.uint8)  # a grey index mask saved as RGB
    return kind, values


def read_index_mask(path: str) -> np.ndarray:
    """The ``H x W`` values (uint8, or 16/32-bit) of an index mask file (mode ``L`` / ``P`` / 16-bit), as displayed:
    the registered datasets' reader, by :func:`read_mask`'s rules (:func:`~encoding.utils.images.upright`).

    Raises:
        DatasetError: the file is missing or unreadable, or not an index image (the message names it).
        ImageTooLarge: over the pixel limit (checked before decoding).
    """
    with _opened_mask(path, colour=False) as (im, _):
        return _as_labels(im, path)[1]


def grey_index(kind: str, values: np.ndarray, colors: Mapping[int, int]) -> bool:
    """Whether a mask read as ``kind`` with (packed) ``values`` is an index mask saved as RGB: an RGB mask whose every
    pixel is grey, unless the class file gives colours and every colour of the mask is one of them (or the ignore
    colour), as CamVid's sky (128, 128, 128) is. The one rule of the scan and the loader."""
    if kind != "color" or not _grey(values).all():
        return False
    return not (colors and all(int(v) in colors for v in np.unique(values)))


def _grey(packed: np.ndarray) -> np.ndarray:
    return ((packed >> 16) & 255 == (packed >> 8) & 255) & ((packed >> 8) & 255 == packed & 255)


def mask_histogram(path: str) -> Dict[str, Any]:
    """Every value of the mask ``path`` counted, in pieces of :data:`PIECE_PIXELS` pixels (never a wide copy of the
    whole mask): ``{"size": [w, h], "format", "lossy", "kind", "values", "counts"}``, as :func:`_as_labels` reads it
    (an RGB mask's packed colours, grey or not: :func:`grey_index` decides with the classes); a palette (``P``) mask
    adds ``"palette"``: ``[value, packed colour]`` of each of its values.

    Raises:
        DatasetError: as :func:`read_mask`, or the mask holds more than :data:`MAX_MASK_VALUES` distinct values.
        ImageTooLarge: over the pixel limit (checked before decoding).
    """
    counts: Dict[int, int] = {}
    with _opened_mask(path) as (im, stored):
        fmt, lossy = stored.format or "", _lossy(stored, path)  # the scan's alone, not the loader's every read
        (w, h), kind = im.size, "index" if im.mode in _INDEX_MODES else "color"
        rows = max(1, PIECE_PIXELS // max(w, 1))
        for top in range(0, h, rows):
            kind, piece = _as_labels(im.crop((0, top, w, min(h, top + rows))), path)
            if piece.dtype == np.uint8:
                n = np.bincount(piece.ravel(), minlength=256)
                found = np.flatnonzero(n)
                n = n[found]
            else:
                found, n = np.unique(piece, return_counts=True)
            for v, c in zip(found.tolist(), n.tolist()):
                counts[v] = counts.get(v, 0) + c
            if len(counts) > MAX_MASK_VALUES:
                raise DatasetError(path, f"holds more than {MAX_MASK_VALUES} different values: not a label mask (a "
                                         "photo, or a smoothed export?)")
        rgb = im.getpalette() if im.mode == "P" else None
    values = sorted(counts)
    record = {"size": [w, h], "format": fmt, "lossy": lossy, "kind": kind, "values": values,
              "counts": [counts[v] for v in values]}
    if rgb:  # each value's colour: a colour mask converted to a palette image shows in them
        record["palette"] = [[v, int(pack_colors(np.array(rgb[3 * v:3 * v + 3], dtype=np.uint8)))]
                             for v in values if 3 * v + 3 <= len(rgb)]
    return record


def color_lookup(spec: Optional[ClassSpec]) -> Dict[int, int]:
    """Packed colour -> raw label value (the class id, or the ignore value for the ignore colour)."""
    if spec is None or spec.colors is None:
        return {}
    table = {int(pack_colors(np.array(c, dtype=np.uint8))): i for i, c in enumerate(spec.colors)}
    if spec.ignore_color is not None:
        table[int(pack_colors(np.array(spec.ignore_color, dtype=np.uint8)))] = spec.ignore_index
    return table


def format_colors(packed: Sequence[int]) -> str:
    """Packed colours as ``(r, g, b)`` text."""
    return ", ".join(f"({p >> 16 & 255}, {p >> 8 & 255}, {p & 255})" for p in packed)
