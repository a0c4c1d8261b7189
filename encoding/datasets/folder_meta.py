"""The classes of a folder dataset and how its masks encode them: ``classes.{yaml,json,txt}`` and the mask reader.

A class file names the classes in id order and may give their colours and the ignore value::

    # classes.yaml (or the same structure in classes.json)
    classes: [background, cat, dog]            # or [{name: cat, color: [255, 0, 0]}, ...]
    colors: [[0, 0, 0], [255, 0, 0], [0, 0, 255]]   # optional (also "palette")
    ignore_index: 255                           # optional, the default
    ignore_color: [255, 255, 255]               # optional: the ignore colour of RGB masks

    # classes.txt: one class per line, optionally followed by its colour ("cat 255 0 0")

Masks are index images (mode ``L`` / ``P`` / 16-bit, or RGB whose three channels are equal) holding class ids, or
RGB colour-coded masks (CVAT / LabelMe / Label Studio exports) mapped through the class file's colours. Without a
class file the class count comes from the scan of the masks (the largest value + 1, names ``class_0 ...``), and
masks that hold only 0 and 255 are binary masks (255 = foreground).
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from .layout import DatasetError as _BaseDatasetError

__all__ = ["DataError", "CLASS_FILES", "ClassSpec", "read_class_file", "read_mask", "pack_colors", "color_lookup", "format_colors"]

class DataError(_BaseDatasetError):
    """A problem of a user's folder dataset found before training (one line naming the file; exit status 2)."""

    exit_status = 2


DatasetError = DataError  # every error raised here is a DataError

#: The class files looked for in a folder dataset's root, in this order.
CLASS_FILES = ("classes.yaml", "classes.yml", "classes.json", "classes.txt")
RGB = Tuple[int, int, int]
_INDEX_MODES = ("L", "P", "I", "I;16", "1")


@dataclass(frozen=True)
class ClassSpec:
    """The classes of a dataset: names in id order, optional colours, the raw ignore value and ignore colour."""

    names: Tuple[str, ...]
    colors: Optional[Tuple[RGB, ...]] = None
    ignore_index: int = 255
    ignore_color: Optional[RGB] = None
    source: str = ""


def _color(value: Any, where: str) -> RGB:
    if isinstance(value, str):
        value = [v for v in re.split(r"[\s,]+", value.strip().lstrip("#")) if v]
    try:
        rgb = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        rgb = ()
    if len(rgb) != 3 or not all(0 <= v <= 255 for v in rgb):
        raise DatasetError(where, f"colour {value!r} is not an (r, g, b) triple of 0..255")
    return rgb  # type: ignore[return-value]


def _from_mapping(data: Any, path: str) -> ClassSpec:
    if isinstance(data, list):
        data = {"classes": data}
    if not isinstance(data, dict) or not isinstance(data.get("classes"), list) or not data["classes"]:
        raise DatasetError(path, "expected a list of class names, or a mapping with a non-empty 'classes' list")
    names, colors = [], []
    for item in data["classes"]:
        if isinstance(item, dict):
            if "name" not in item:
                raise DatasetError(path, f"class entry {item!r} has no 'name'")
            names.append(str(item["name"]))
            if "color" in item or "colour" in item:
                colors.append(_color(item.get("color", item.get("colour")), path))
        else:
            names.append(str(item))
    given = data.get("colors", data.get("colours", data.get("palette")))
    if given is not None:
        colors = [_color(c, path) for c in given]
    ignore = data.get("ignore_index", data.get("ignore", 255))
    ignore_color = data.get("ignore_color", data.get("ignore_colour"))
    return _spec(names, colors, ignore, None if ignore_color is None else _color(ignore_color, path), path)


def _from_text(text: str, path: str) -> ClassSpec:
    names, colors = [], []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if not line:
            continue
        parts = re.split(r"[\s,]+", line)
        if len(parts) >= 4 and all(p.isdigit() for p in parts[-3:]):
            names.append(" ".join(parts[:-3]))
            colors.append(_color(parts[-3:], path))
        else:
            names.append(line)
    return _spec(names, colors, 255, None, path)


def _spec(names: List[str], colors: List[RGB], ignore: Any, ignore_color: Optional[RGB], path: str) -> ClassSpec:
    if not names:
        raise DatasetError(path, "names no class")
    if len(set(names)) != len(names):
        raise DatasetError(path, f"class names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    if colors and len(colors) != len(names):
        raise DatasetError(path, f"gives {len(colors)} colours for {len(names)} classes (one per class, or none)")
    if colors and len(set(colors)) != len(colors):
        raise DatasetError(path, "two classes have the same colour")
    if not isinstance(ignore, int) or not 0 <= ignore <= 255 or ignore < len(names) or len(names) > 254:
        raise DatasetError(path, f"ignore_index {ignore!r} must be an integer in [{len(names)}, 255] (at most 254 "
                                 "classes)")
    return ClassSpec(tuple(names), tuple(colors) or None, ignore, ignore_color, path)


def read_class_file(root: str) -> Optional[ClassSpec]:
    """The :class:`ClassSpec` of the first of :data:`CLASS_FILES` in ``root``, or ``None`` when there is none.

    Raises:
        DatasetError: the file cannot be parsed or is inconsistent (the message names it).
    """
    for name in CLASS_FILES:
        path = os.path.join(root, name)
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if name.endswith(".txt"):
            return _from_text(text, path)
        try:
            if name.endswith(".json"):
                data = json.loads(text)
            else:
                import yaml  # PyYAML: only for a classes.yaml
                data = yaml.safe_load(text)
        except ImportError:
            raise DatasetError(path, "reading a YAML class file needs PyYAML (pip install pyyaml), or write "
                                     "classes.json / classes.txt") from None
        except ValueError as err:  # json.JSONDecodeError, yaml.YAMLError is not one: caught below
            raise DatasetError(path, f"cannot parse ({str(err).splitlines()[0]})") from None
        except Exception as err:  # yaml.YAMLError
            raise DatasetError(path, f"cannot parse ({str(err).splitlines()[0]})") from None
        return _from_mapping(data, path)
    return None


def pack_colors(rgb: np.ndarray) -> np.ndarray:
    """``... x 3`` uint8 colours -> one int64 per colour (``r << 16 | g << 8 | b``)."""
    rgb = rgb.astype(np.int64)
    return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]


def read_mask(path: str) -> Tuple[str, np.ndarray]:
    """``("index", H x W ints)`` or ``("color", H x W packed colours)`` of a mask file.

    Raises:
        DatasetError: the file is missing or unreadable, or not a mask (the message names it).
    """
    try:
        with Image.open(path) as im:
            mode = im.mode
            if mode in _INDEX_MODES:
                return "index", np.array(im).astype(np.int64)
            if mode not in ("RGB", "RGBA"):
                raise DatasetError(path, f"mask has mode {mode}; expected an index image (mode L or P) or RGB")
            rgb = np.array(im.convert("RGB"))
    except FileNotFoundError:
        raise DatasetError(path, "mask file is missing") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        if isinstance(err, DatasetError):
            raise
        raise DatasetError(path, f"cannot decode mask ({err})") from err
    if (rgb[..., 0] == rgb[..., 1]).all() and (rgb[..., 1] == rgb[..., 2]).all():
        return "index", rgb[..., 0].astype(np.int64)  # a grey index mask saved as RGB
    return "color", pack_colors(rgb)


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
