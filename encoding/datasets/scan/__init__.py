"""The one scan of a folder dataset before training: every image and mask decoded once, every bad file named.

:func:`scan_pairs` decodes each image fully (a truncated file is caught) and counts each mask's values in pieces
(:func:`~.folder_meta.mask_histogram`), both as the loader reads them: the pixel limit checked from the header
(:func:`~encoding.utils.images.open_image`) and the EXIF orientation applied
(:func:`~encoding.utils.images.upright`, the one rule). It keeps per pair the sizes, the mask's encoding and value
histogram, or the problem that stopped reading. The records are cached in a cache folder (:func:`cache_file`:
``$XDG_CACHE_HOME/encoding/scans`` or ``~/.cache/encoding/scans``, never in the dataset's folder, which may be
read-only), each stamped with its files' sizes and modification times: only new or changed files are read again.

:func:`check_scan` then finds, without reading anything, **every** bad file -- unreadable or truncated files, images
over the pixel limit, lossy masks (JPEG, JPEG 2000, AVIF, lossy WebP, JPEG-compressed TIFF), RGBA masks with
transparent pixels, masks whose size differs from their image's, values or colours of no class -- and raises one
:class:`~encoding.datasets.DatasetError` naming them grouped by problem (the count and the first names of each
group; the full list in a file of the temp folder when there are more), before any run directory is written. The
label audit (:mod:`.audit`) follows. ``python -m encoding.datasets.scan DIR`` runs the scan alone and prints its
summary and the class-pixel table.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ...utils.files import atomic_write, user_cache_file
from ...utils.images import ImageTooLarge, max_pixels, open_image, orientation
from .audit import UNKNOWN_LABELS, FolderScan, audit, resolve_classes
from ..base import check_image
from ..folder_meta import (LOSSY_FORMATS, ClassSpec, TransparentMask, color_lookup, format_colors, grey_index,
                           mask_histogram)
from ..layout import DatasetError

__all__ = ["UNKNOWN_LABELS", "LOSSY_FORMATS", "FolderScan", "Problem", "cache_file", "record_key", "scan_pairs",
           "check_scan", "report"]

#: A bad file: ``(problem group, path, detail)``.
Problem = Tuple[str, str, str]
Pair = Tuple[str, str]
#: The problem groups in the order a report lists them, with what each one means.
GROUPS = {
    "unpaired": "without its image or mask",
    "unreadable": "unreadable or truncated",
    "too large": "over the pixel limit (raise it with --max-pixels or ENCODING_MAX_PIXELS)",
    "lossy": "lossy masks (JPEG, JPEG 2000, lossy WebP, JPEG-compressed TIFF...: compression alters label values; "
             "masks must be PNG or another lossless format)",
    "transparent": "masks with transparent pixels (their colour is no label: flatten them onto the background "
                   "colour, save them as RGB)",
    "size": "mask size differs from its image",
    "values": "values of no class",
}
#: Names shown per group in the one-line report (all of them go to the list file when there are more).
SHOWN = 3
_CACHE_VERSION = 4  # 4: records hold the EXIF orientations


def _stamp(path: str) -> List[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def _record(image: str, mask: str) -> Dict[str, Any]:
    """One pair's record: sizes, the mask's format, encoding and value histogram, or the problem that stopped it."""
    record: Dict[str, Any] = {"stamp": [_stamp(image), _stamp(mask)]}
    turned = 1
    for path, read in ((image, check_image), (mask, mask_histogram)):
        try:
            found = read(path)
        except ImageTooLarge as err:
            record["error"] = ["too large", path, str(err)[len(path) + 2:].split(" (checked")[0]]
        except TransparentMask as err:
            record["error"] = ["transparent", err.path, err.problem]
        except DatasetError as err:
            record["error"] = ["unreadable", err.path, err.problem]
        else:
            if path == image:
                record["image_size"], turned = list(found), _orientation(image)
            else:  # the EXIF orientations of the image and its mask (read only when the image has one)
                record.update({k: v for k, v in found.items() if k != "size"}, mask_size=found["size"],
                              orientation=[turned, _orientation(mask) if turned != 1 else 1])
            continue
        break
    return record


def _orientation(path: str) -> int:
    """The EXIF orientation of the (readable) image ``path``, from its header: opened, not decoded."""
    with open_image(path) as im:
        return orientation(im)


def record_key(root: str, image: str, mask: str) -> str:
    """The key of a pair's scan record: its two paths relative to ``root``, as JSON (any file name survives)."""
    return json.dumps([os.path.relpath(image, root), os.path.relpath(mask, root)], ensure_ascii=False)


def cache_file(root: str) -> str:
    """Where the scan records of the dataset ``root`` are cached: a file of the user's cache folder named after the
    root's absolute path (``$XDG_CACHE_HOME/encoding/scans/<hash>.json``, default ``~/.cache/encoding/...``)."""
    return user_cache_file("scans", root)


def _read_cache(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    ok = isinstance(data, dict) and data.get("version") == _CACHE_VERSION and isinstance(data.get("records"), dict)
    return data["records"] if ok else {}


def scan_pairs(root: str, pairs: Sequence[Pair], *, cache: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """The scan record of every ``(image, mask)`` pair (key: the pair's relative paths as JSON), from the cache
    where the files are unchanged.

    Args:
        root: the dataset's root (nothing is written there).
        pairs: the image and mask paths.
        cache: the cache file (:func:`cache_file`), ``None``: no cache. A cache that cannot be written only warns.
    """
    cached = _read_cache(cache) if cache else {}
    records, changed = {}, False
    for image, mask in pairs:
        key = record_key(root, image, mask)
        old = cached.get(key)
        try:
            fresh = isinstance(old, dict) and old.get("stamp") == [_stamp(image), _stamp(mask)]
        except OSError:
            fresh = False
        if not fresh:
            try:
                old, changed = _record(image, mask), True
            except OSError as err:  # vanished between the listing and the read
                old = {"error": ["unreadable", image, f"cannot read ({err})"]}
        records[key] = dict(old, image=image, mask=mask)
    if cache and (changed or set(records) != set(cached)):
        keep = {k: {n: v for n, v in r.items() if n not in ("image", "mask")} for k, r in records.items()
                if "stamp" in r and "error" not in r}
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            atomic_write(cache, json.dumps({"version": _CACHE_VERSION, "root": os.path.abspath(root),
                                            "records": keep}))
        except OSError as err:
            warnings.warn(f"cannot cache the scan of the dataset in {cache}: {err}")
    return records


def _problem(record: Dict[str, Any], allowed: Dict[int, int], spec: ClassSpec) -> Optional[Tuple[Problem, int]]:
    """``((group, path, detail), pixels of no class)`` of one record, ``None`` when it is good."""
    if "error" in record:
        return tuple(record["error"]), 0  # type: ignore[return-value]
    for side in ("image", "mask"):  # a record cached under a higher limit
        w, h = record[f"{side}_size"]
        if w * h > max_pixels():
            return ("too large", record[side], f"image of {w} x {h} = {w * h:,} pixels is over the limit of "
                                               f"{max_pixels():,} pixels"), 0
    if _lossy(record):
        how = "a lossy format" if record.get("format") in LOSSY_FORMATS else "compressed lossily"
        return ("lossy", record["mask"], f"mask is {record['format']}, {how}: compression alters label values; save "
                                         "masks as PNG (or another lossless format)"), 0
    if record["image_size"] != record["mask_size"]:
        (iw, ih), (mw, mh) = record["image_size"], record["mask_size"]
        return ("size", record["mask"], f"mask size {mw}x{mh} (WxH) differs from its image {record['image']} "
                                        f"({iw}x{ih}, as displayed)"), 0
    bad = [(v, c) for v, c in zip(record["values"], record["counts"]) if v not in allowed]
    if not bad:
        return None
    shown = [v for v, _ in bad[:10]]
    n, zero = len(spec.names), " (reduce_zero_label: 1..n, 0 ignored)" if spec.reduce_zero_label else ""
    what = (f"colours {format_colors(shown)} are not class colours" if record["kind"] == "color"
            else f"label values {shown} are outside the {n} classes{zero} (and not ignore {spec.ignore_index})")
    what += f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
    return ("values", record["mask"], what), sum(c for _, c in bad)


def _lossy(record: Dict[str, Any]) -> bool:
    return bool(record.get("lossy"))  # mask_histogram's verdict (LOSSY_FORMATS and the file's own compression)


def _as_read(record: Dict[str, Any], colors: Mapping[int, int]) -> Dict[str, Any]:
    """``record`` with its mask read as the loader reads it: a grey RGB mask as an index mask unless its colours are
    all class colours (:func:`~.folder_meta.grey_index`, the loader's rule)."""
    if "values" not in record or not grey_index(record.get("kind", ""), np.array(record["values"], np.uint32), colors):
        return record
    return dict(record, kind="index", values=[v & 255 for v in record["values"]])


def _show(path: str, root: str) -> str:
    """A file as a report names it: relative to ``root``, escaped when it holds a newline or another control."""
    rel = os.path.relpath(path, root) if root and os.path.isabs(path) else path
    return rel if rel.isprintable() else json.dumps(rel, ensure_ascii=False)


def report(problems: Sequence[Problem], root: str) -> DatasetError:
    """The one-line error of every bad file: the file and its problem when there is one; else each group with its
    count and first :data:`SHOWN` names, and (when more) the file of the temp folder listing them all."""
    if len(problems) == 1:
        _, path, detail = problems[0]
        return DatasetError(path if path.isprintable() else json.dumps(path, ensure_ascii=False), detail)
    groups: Dict[str, List[Problem]] = {}
    for problem in problems:
        groups.setdefault(problem[0], []).append(problem)
    parts = []
    for group in sorted(groups, key=lambda g: list(GROUPS).index(g) if g in GROUPS else len(GROUPS)):
        found = groups[group]
        shown = [(p, detail.replace(root + os.sep, "") if root else detail) for _, p, detail in found[:SHOWN]]
        names = ", ".join(f"{_show(p, root)} ({detail})" if len(detail) <= 100 else _show(p, root)
                          for p, detail in shown)
        parts.append(f"{len(found)} {GROUPS.get(group, group)}: {names}" + (", ..." if len(found) > SHOWN else ""))
    text = f"{len(problems)} bad files, nothing was written; " + "; ".join(parts)
    if any(len(found) > SHOWN for found in groups.values()):
        text += f"; every bad file is listed in {_write_list(problems, root)}"
    return DatasetError(root, text)


def _write_list(problems: Sequence[Problem], root: str) -> str:
    """The full list of bad files, one per line (``problem<TAB>file<TAB>detail``, the file escaped as JSON when it
    holds a tab or a newline), in the temp folder (never the dataset's)."""
    digest = hashlib.sha256(os.path.abspath(root).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"encoding-scan-{digest}.txt")
    lines = [f"# the bad files of {root} (problem, file, detail)\n"]
    lines += [f"{group}\t{_show(p, root)}\t{' '.join(detail.split())}\n" for group, p, detail in problems]
    return atomic_write(path, "".join(lines))


def check_scan(records: Dict[str, Dict[str, Any]], spec: Optional[ClassSpec], unknown: str = "error", *,
               root: str = "", problems: Sequence[Problem] = (), binary: bool = False,
               train: Optional[Sequence[str]] = None) -> FolderScan:
    """Check the scan records against the classes (resolved from the masks when ``spec`` is ``None``), then audit
    the labels (:func:`.audit.audit`).

    Args:
        records: :func:`scan_pairs`' records.
        spec: the class file's classes, or ``None``.
        unknown: ``error`` or ``ignore`` (values of no class become ignored pixels, counted).
        root: the dataset's root (names in the report are relative to it).
        problems: bad files found before the scan (unpaired files).
        binary: a ``--binary`` run: 0/255 masks are foreground 255 even with a class file; mixed 0/1 and 0/255 masks
            are refused.
        train: the keys of the training split's records (the audit warns of classes it lacks).

    Raises:
        DatasetError: every bad file in one line (:func:`report`), or the audit's refusal.
    """
    if unknown not in UNKNOWN_LABELS:
        raise ValueError(f"unknown must be one of {UNKNOWN_LABELS}, got {unknown!r}")
    raw_colors = color_lookup(spec)
    records = {k: _as_read(r, raw_colors) for k, r in records.items()}
    readable = {k: r for k, r in records.items() if "error" not in r and not _lossy(r)}
    spec, binary_255 = resolve_classes(list(readable.values()), spec, binary)
    first = spec.first_value
    index = {i + first: i for i in range(len(spec.names))}
    index.update({255: 1} if binary_255 else {spec.ignore_index: -1, **({0: -1} if first else {})})
    colors = {c: (i if i != spec.ignore_index else -1) for c, i in color_lookup(spec).items()}
    found, unknown_pixels, mapped = list(problems), {}, {}
    for key, record in records.items():
        allowed = colors if record.get("kind") == "color" else index
        problem = _problem(record, allowed, spec)
        if problem is not None and not (problem[1] and unknown == "ignore"):
            found.append(problem[0])
        elif problem is not None:
            unknown_pixels[key] = problem[1]
        mapped[key] = allowed
    if found:
        raise _with_hint(report(found, root), readable.values(), spec)
    scan = audit(records, mapped, spec, binary_255, unknown_pixels, binary=binary, train=train, root=root)
    scan.warnings += _palette_swaps(records, spec, raw_colors, root) + _turned_images(readable.values(), root)
    return scan


def _with_hint(error: DatasetError, records: Iterable[Dict[str, Any]], spec: ClassSpec) -> DatasetError:
    """``error``, with the hint ``reduce_zero_label`` when the class file names ``n`` classes and the index masks
    hold 0 and ``n`` and nothing else outside ``0..n`` but the ignore value: 0 is likely "unlabelled"."""
    values = {v for r in records if r.get("kind") == "index" for v in r["values"]} - {spec.ignore_index}
    n = len(spec.names)
    if spec.reduce_zero_label or not os.path.isfile(spec.source) or not {0, n} <= values <= set(range(n + 1)):
        return error
    return DatasetError(error.path, f"{error.problem}; if 0 means unlabelled, add reduce_zero_label: true to "
                                    f"{spec.source}")


def _turned_images(records: Iterable[Dict[str, Any]], root: str) -> List[str]:
    """The warning of images whose EXIF orientation (another than their mask's) turns or flips them without
    changing their size (a flip, 180 degrees, or a square image): their mask's size cannot tell whether it was
    drawn on the image as displayed or as stored."""
    turned = [(r, r["orientation"][0]) for r in records if len(set(r.get("orientation", [1]))) > 1
              and (r["orientation"][0] in (2, 3, 4) or r["image_size"][0] == r["image_size"][1])]
    if not turned:
        return []
    return [f"{len(turned)} image(s) carry an EXIF orientation that turns or flips them without changing their size "
            f"(e.g. {_show(turned[0][0]['image'], root)}: orientation {turned[0][1]}), so their masks' "
            "size cannot tell which reading they were drawn on: the masks are taken as drawn on the upright image, "
            "as displayed; if they were drawn on the stored pixels, or to silence this, save the images upright "
            "(PIL.ImageOps.exif_transpose) without the orientation tag"]


def _palette_swaps(records: Dict[str, Dict[str, Any]], spec: ClassSpec, raw_colors: Mapping[int, int],
                   root: str) -> List[str]:
    """Warnings of palette masks whose colour for a value is another class's colour in the class file
    (``raw_colors``: :func:`~.folder_meta.color_lookup`'s): a colour mask converted to a palette image (its values
    are palette slots, not class ids), read as class ids as every ``P`` mask is."""
    colors, first = {c: i for c, i in raw_colors.items() if i < len(spec.names)}, spec.first_value
    swapped = [(r, v, colors[c]) for r in records.values() for v, c in r.get("palette", ())
               if c in colors and colors[c] != v - first]
    if not swapped:
        return []
    record, value, other = swapped[0]
    files = len({id(r) for r, _, _ in swapped})
    read = spec.names[value - first] if 0 <= value - first < len(spec.names) else "no class"
    return [f"{files} palette mask(s) colour a value as another class (e.g. {_show(record['mask'], root)}: value "
            f"{value} is read as {read!r} but coloured as "
            f"{spec.names[other]!r}): a palette mask's values are its class ids; if its colours are the classes, "
            "save it as RGB"]
