"""The one scan of a folder dataset before training: every image and mask opened once, every problem found.

:func:`scan_pairs` reads each image's header (a verify pass) and each mask's values, and keeps per file its size,
its encoding (index or colour) and its value histogram. The records are cached in ``<root>/.encoding-scan.json``,
each stamped with its files' sizes and modification times (only new or changed files are read again). From the
records, :func:`check_scan` finds, without reading anything:

* masks whose size differs from their image's, unreadable files;
* values outside the classes (index values that are neither a class id nor the ignore value, colours of no class),
  named per file -- or, with ``unknown="ignore"``, mapped to ignore and counted;

and resolves the classes when there is no class file (the largest value + 1; a 0/255 mask set is binary). Problems
are raised as one :class:`~encoding.datasets.layout.DatasetError` naming the first file (and how many more there
are), before any run directory is written.
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from ..utils.files import atomic_write
from .base import check_image
from .folder_meta import ClassSpec, DataError, color_lookup, format_colors, read_mask
from .layout import DatasetError as _BaseDatasetError

__all__ = ["SCAN_CACHE", "UNKNOWN_LABELS", "FolderScan", "scan_pairs", "check_scan"]

#: The cache of the per-file scan records, in the dataset's root.
SCAN_CACHE = ".encoding-scan.json"
#: ``--unknown-labels``: a value outside the classes is an ``error`` (default) or is mapped to ``ignore``.
UNKNOWN_LABELS = ("error", "ignore")
Pair = Tuple[str, str]


def _stamp(path: str) -> List[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def _record(image: str, mask: str) -> Dict[str, Any]:
    """One pair's record: sizes, the mask's encoding and value histogram, or the problem that stopped reading."""
    record: Dict[str, Any] = {"stamp": [_stamp(image), _stamp(mask)]}
    try:
        check_image(image)
        with Image.open(image) as im:
            record["image_size"] = list(im.size)
        kind, values = read_mask(mask)
    except _BaseDatasetError as err:
        record["error"] = [err.path, err.problem]
        return record
    found, counts = np.unique(values, return_counts=True)
    record.update(mask_size=[int(values.shape[1]), int(values.shape[0])], kind=kind,
                  values=[int(v) for v in found], counts=[int(c) for c in counts])
    return record


def _read_cache(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def scan_pairs(root: str, pairs: Sequence[Pair], *, cache: bool = True) -> Dict[str, Dict[str, Any]]:
    """The scan record of every ``(image, mask)`` pair (mask path -> record), from the cache where unchanged.

    Args:
        root: the dataset's root (the cache lives there; a read-only root only warns).
        pairs: the image and mask paths.
        cache: read and write :data:`SCAN_CACHE`.
    """
    path = os.path.join(root, SCAN_CACHE)
    cached = _read_cache(path) if cache else {}
    records, changed = {}, False
    for image, mask in pairs:
        key = f"{os.path.relpath(image, root)}\t{os.path.relpath(mask, root)}"
        old = cached.get(key)
        try:
            fresh = isinstance(old, dict) and old.get("stamp") == [_stamp(image), _stamp(mask)]
        except OSError:
            fresh = False
        if not fresh:
            try:
                old, changed = _record(image, mask), True
            except OSError as err:
                old = {"error": [image, f"cannot read ({err})"]}
        records[key] = dict(old, image=image, mask=mask)
    if cache and (changed or set(records) != set(cached)):
        keep = {k: {n: v for n, v in r.items() if n not in ("image", "mask")} for k, r in records.items()
                if "error" not in r}
        try:
            atomic_write(path, json.dumps(keep))
        except OSError as err:
            warnings.warn(f"cannot cache the scan of the dataset in {path}: {err}")
    return records


@dataclass
class FolderScan:
    """What the scan found: the resolved classes, the raw-value encoding, and the class pixel counts.

    Attributes:
        spec: the classes (the class file's, or resolved from the values).
        binary_255: masks hold 0 / 255 with 255 = foreground (no class file).
        pixels: pixels per class over every mask; ignored: pixels of the ignore value; unknown: pixels outside the
            classes mapped to ignore (``unknown="ignore"``), in ``unknown_files`` files.
    """

    spec: ClassSpec
    binary_255: bool = False
    pixels: List[int] = field(default_factory=list)
    ignored: int = 0
    unknown: int = 0
    unknown_files: int = 0
    samples: int = 0

    def summary(self) -> str:
        """One line: the samples, and each class's share of the labelled pixels."""
        total = max(sum(self.pixels) + self.ignored + self.unknown, 1)
        shares = ", ".join(f"{name} {100.0 * n / total:.1f}%" for name, n in zip(self.spec.names, self.pixels))
        line = f"scanned {self.samples} image/mask pairs, {len(self.spec.names)} classes: {shares}"
        line += f"; ignored {100.0 * self.ignored / total:.1f}%"
        if self.unknown:
            line += (f"; {self.unknown} pixels in {self.unknown_files} masks hold values outside the classes and "
                     "are ignored (--unknown-labels ignore)")
        return line


def _resolve(records: List[Dict[str, Any]], spec: Optional[ClassSpec]) -> Tuple[ClassSpec, bool]:
    """The class file's spec, or one resolved from the index values of the masks."""
    if spec is not None:
        return spec, False
    colored = next((r for r in records if r.get("kind") == "color"), None)
    if colored is not None:
        raise DataError(colored["mask"], "is an RGB colour mask: colour masks need the class colours in a class "
                                            "file (classes.yaml / .json / .txt next to the images)")
    values = sorted({v for r in records for v in r.get("values", ())})
    if values and set(values) <= {0, 255} and 255 in values:
        return ClassSpec(("background", "foreground"), source="0/255 masks"), True
    top = max([v for v in values if v != 255], default=0)
    if top > 253:
        mask = next(r["mask"] for r in records if top in r.get("values", ()))
        raise DataError(mask, f"holds label value {top}: more than 254 classes (or add a class file)")
    return ClassSpec(tuple(f"class_{i}" for i in range(top + 1)), source="scan"), False


def _problem(record: Dict[str, Any], allowed: Dict[int, int], spec: ClassSpec) -> Optional[Tuple[str, str, int]]:
    """``(path, problem, unknown pixels)`` of one record; problem ``""`` when only unknown values were found."""
    if "error" in record:
        return record["error"][0], record["error"][1], 0
    if record["image_size"] != record["mask_size"]:
        (iw, ih), (mw, mh) = record["image_size"], record["mask_size"]
        return record["mask"], f"mask size {mw}x{mh} (WxH) differs from its image {record['image']} ({iw}x{ih})", 0
    bad = [(v, c) for v, c in zip(record["values"], record["counts"]) if v not in allowed]
    if not bad:
        return None
    shown = [v for v, _ in bad[:10]]
    what = (f"colours {format_colors(shown)} are not class colours" if record["kind"] == "color"
            else f"label values {shown} are outside the {len(spec.names)} classes (and not ignore {spec.ignore_index})")
    return record["mask"], what + (f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""), sum(c for _, c in bad)


def check_scan(records: Dict[str, Dict[str, Any]], spec: Optional[ClassSpec], unknown: str = "error") -> FolderScan:
    """Check the scan records against the classes; resolve the classes when ``spec`` is ``None``.

    Raises:
        DatasetError: one line naming the first bad file (and the number of other problems).
    """
    if unknown not in UNKNOWN_LABELS:
        raise ValueError(f"unknown must be one of {UNKNOWN_LABELS}, got {unknown!r}")
    rows = list(records.values())
    readable = [r for r in rows if "error" not in r]
    spec, binary_255 = _resolve(readable, spec)
    index = {i: i for i in range(len(spec.names))}
    index.update({255: 1} if binary_255 else {spec.ignore_index: -1})
    colors = {c: (i if i != spec.ignore_index else -1) for c, i in color_lookup(spec).items()}
    result = FolderScan(spec, binary_255, [0] * len(spec.names), samples=len(rows))
    problems = []
    for record in rows:
        allowed = colors if record.get("kind") == "color" else index
        found = _problem(record, allowed, spec)
        if found is not None and not (found[2] and unknown == "ignore"):
            problems.append(found)
            continue
        if found is not None:
            result.unknown += found[2]
            result.unknown_files += 1
        for v, c in zip(record["values"], record["counts"]):
            cls = allowed.get(v)
            if cls is None:
                continue
            if cls < 0:
                result.ignored += c
            else:
                result.pixels[cls] += c
    if problems:
        path, problem, _ = problems[0]
        more = f" (and {len(problems) - 1} more bad files)" if len(problems) > 1 else ""
        raise DataError(path, problem + more)
    return result
