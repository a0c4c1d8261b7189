"""The label audit of a folder dataset's scan: what the masks hold, class by class, and what cannot be right.

From the scan records of readable masks, :func:`audit` counts per class the share of the pixels and of the masks
that hold it, the ignore value's share and the values of no class (``--unknown-labels ignore``), and

* refuses, naming the class file and the fix, a class with no pixel while the ignore value covers
  :data:`SUSPECT_IGNORE` or more of the mask pixels, or while a two-class file's masks hold only 0 and 255 however
  few the 255 pixels (a thin foreground: 255 is the ignore value, so it would never be seen: "did you mean
  --binary, or masks with values 0/1?");
* refuses, with ``--binary``, masks that mix the 0/1 and 0/255 encodings (255 would be ignore in the first and
  foreground in the second), and warns of the same mix without ``--binary``;
* warns of every class with no pixel, in all the masks or in the training split.

:func:`resolve_classes` gives the classes of a folder without a class file (the largest value + 1; 0/255 masks are
binary), and decides whether 255 is the foreground (``binary_255``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..folder_meta import ClassSpec
from ..layout import DatasetError

__all__ = ["UNKNOWN_LABELS", "SUSPECT_IGNORE", "FolderScan", "resolve_classes", "audit"]

#: ``--unknown-labels``: a value outside the classes is an ``error`` (default) or is mapped to ``ignore``.
UNKNOWN_LABELS = ("error", "ignore")
#: The ignore value's share of the pixels from which a class without pixels is refused rather than warned of.
SUSPECT_IGNORE = 0.2


@dataclass
class FolderScan:
    """What the scan found: the resolved classes, the raw-value encoding, and the class pixel counts.

    Attributes:
        spec: the classes (the class file's, or resolved from the values).
        binary_255: 255 is the foreground (0/255 masks without a class file, or with ``--binary``).
        pixels: pixels per class over every mask; images: masks holding each class; ignored: pixels of the ignore
            value (in ``ignored_images`` masks); unknown: pixels outside the classes mapped to ignore
            (``unknown="ignore"``), in ``unknown_files`` masks; samples: image/mask pairs.
        train_pixels: pixels per class in the training split (``None``: not known).
        warnings: the audit's warnings (a class without pixels, mixed binary encodings), one line each.
    """

    spec: ClassSpec
    binary_255: bool = False
    pixels: List[int] = field(default_factory=list)
    images: List[int] = field(default_factory=list)
    ignored: int = 0
    ignored_images: int = 0
    unknown: int = 0
    unknown_files: int = 0
    samples: int = 0
    train_pixels: Optional[List[int]] = None
    warnings: List[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Every pixel of every mask."""
        return sum(self.pixels) + self.ignored + self.unknown

    def share(self, count: int) -> float:
        """``count`` in percent of every mask pixel."""
        return 100.0 * count / max(self.total, 1)

    def summary(self) -> str:
        """One line (the samples and each class's share of the pixels), then a ``warning: ...`` line per warning."""
        shares = ", ".join(f"{name} {self.share(n):.1f}%" for name, n in zip(self.spec.names, self.pixels))
        line = f"scanned {self.samples} image/mask pairs, {len(self.spec.names)} classes: {shares}"
        line += f"; ignored {self.share(self.ignored):.1f}%"
        if self.unknown:
            line += (f"; {self.unknown} pixels in {self.unknown_files} masks hold values outside the classes and "
                     "are ignored (--unknown-labels ignore)")
        return "\n".join([line] + [f"warning: {w}" for w in self.warnings])

    def table(self) -> str:
        """The class-pixel table: per class its id, name, share of the pixels and of the masks holding it."""
        first = self.spec.first_value
        rows = [(str(255 if self.binary_255 and i == 1 else i + first), name, n, k)
                for i, (name, n, k) in enumerate(zip(self.spec.names, self.pixels, self.images))]
        if not self.binary_255:  # 0/255 masks: 255 is the foreground, nothing is ignored
            ignored = f"0,{self.spec.ignore_index}" if first else str(self.spec.ignore_index)
            rows.append((ignored, "(ignored)", self.ignored, self.ignored_images))
        if self.unknown:
            rows.append(("-", "(no class, ignored)", self.unknown, self.unknown_files))
        width = max(len(r[1]) for r in rows)
        lines = [f"{'value':>5}  {'class':<{width}}  {'pixels':>8}  {'masks':>7}"]
        lines += [f"{v:>5}  {name:<{width}}  {self.share(n):7.2f}%  {100.0 * k / max(self.samples, 1):6.1f}%"
                  for v, name, n, k in rows]
        return "\n".join(lines)


def resolve_classes(records: Sequence[Dict[str, Any]], spec: Optional[ClassSpec],
                    binary: bool = False) -> Tuple[ClassSpec, bool]:
    """``(classes, binary_255)``: the class file's (255 is the foreground of a ``binary`` two-class run whose masks
    hold 0/255 and never 1), or resolved from the index values of the masks.

    Raises:
        DatasetError: colour masks without a class file, or values beyond 253 without one.
    """
    values = _index_values(records)
    zero_255 = _only_0_255(values)
    if spec is not None:
        return spec, (binary and zero_255 and len(spec.names) == 2 and spec.ignore_index == 255
                      and not spec.reduce_zero_label)
    colored = next((r for r in records if r.get("kind") == "color"), None)
    if colored is not None:
        raise DatasetError(colored["mask"], "is an RGB colour mask: colour masks need the class colours in a class "
                                            "file (classes.yaml / .json / .txt next to the images)")
    if zero_255:
        return ClassSpec(("background", "foreground"), source="0/255 masks"), True
    top = max([v for v in values if v != 255], default=0)
    if top > 253:
        mask = next(r["mask"] for r in records if top in r.get("values", ()))
        raise DatasetError(mask, f"holds label value {top}: more than 254 classes (or add a class file)")
    return ClassSpec(tuple(f"class_{i}" for i in range(top + 1)), source="scan"), False


def _index_values(records: Iterable[Dict[str, Any]]) -> Set[int]:
    """Every value the index masks of ``records`` hold."""
    return {v for r in records if r.get("kind") == "index" for v in r.get("values", ())}


def _only_0_255(values: Set[int]) -> bool:
    """Whether index masks holding ``values`` are 0/255 masks (255 in them, nothing but 0 besides)."""
    return 255 in values and values <= {0, 255}


def _count(scan: FolderScan, records: Dict[str, Dict[str, Any]], mapped: Dict[str, Dict[int, int]],
           unknown: Dict[str, int], train: Set[str]) -> None:
    for key, record in records.items():
        scan.unknown += unknown.get(key, 0)
        scan.unknown_files += key in unknown
        held = set()
        for v, c in zip(record["values"], record["counts"]):
            cls = mapped[key].get(v)
            if cls is None:
                continue
            held.add(cls)
            if cls < 0:
                scan.ignored += c
            else:
                scan.pixels[cls] += c
                if key in train and scan.train_pixels is not None:
                    scan.train_pixels[cls] += c
        scan.ignored_images += -1 in held
        for cls in held - {-1}:
            scan.images[cls] += 1


def _binary_mix(scan: FolderScan, records: Dict[str, Dict[str, Any]], binary: bool, root: str) -> None:
    """Refuse (``binary``) or warn of masks that mix 0/1 and 0/255 in a two-class dataset (not where the 0/1 masks
    hold 255 too: it is then their ignore value, and a mask of 0 and 255 one without foreground)."""
    if len(scan.spec.names) != 2 or scan.binary_255 or scan.spec.reduce_zero_label:  # 1 and 2 the classes
        return
    ones = [r for r in records.values() if r.get("kind") == "index" and 1 in r["values"]]
    high = [r for r in records.values() if r.get("kind") == "index" and set(r["values"]) <= {0, 255}
            and 255 in r["values"]]
    if not ones or not high or any(255 in r["values"] for r in ones):  # 255 is the 0/1 masks' own ignore value
        return
    share = scan.share(sum(c for r in high for v, c in zip(r["values"], r["counts"]) if v == 255))
    name = os.path.relpath(high[0]["mask"], root) if root else high[0]["mask"]
    one = os.path.relpath(ones[0]["mask"], root) if root else ones[0]["mask"]
    what = (f"{len(ones)} masks hold 0/1 (e.g. {one}) and {len(high)} hold only 0/255 (e.g. {name}): 255 is the "
            f"ignore value, so the 255 pixels of the 0/255 masks ({share:.1f} % of the mask pixels) are ignored, not "
            "foreground; save every mask with the same values (0/1, or 0/255 with no 1)")
    if binary:
        raise DatasetError(root or name, f"--binary: {what}")
    scan.warnings.append(what)


def _empty_classes(scan: FolderScan, root: str, train_count: int, zero_255: bool) -> None:
    """Refuse masks of no class pixel at all, a class without pixels while the ignore value is common, or while two
    classes' masks hold only 0 and 255 (``zero_255``: the 255 pixels are the missing class, however few); warn of
    classes without pixels (only, with ``reduce_zero_label``: the class file says the ignored 0 is no class)."""
    ignored = scan.share(scan.ignored)
    if scan.samples and not any(scan.pixels):  # nothing to learn or to score
        raise DatasetError(root or scan.spec.source, f"no mask pixel is of a class: {scan.share(scan.unknown):.1f} % "
                           "hold values outside the classes (ignored: --unknown-labels ignore) and "
                           f"{ignored:.1f} % the ignore value {scan.spec.ignore_index}; check the class file against "
                           "the masks' values")
    binary_file = zero_255 and len(scan.spec.names) == 2 and scan.spec.ignore_index == 255
    suspect = ((ignored >= 100 * SUSPECT_IGNORE or binary_file) and not scan.binary_255
               and not scan.spec.reduce_zero_label)
    for i, name in enumerate(scan.spec.names):
        if scan.pixels[i] == 0 and suspect:
            hint = ("did you mean --binary, or masks with values 0/1?" if len(scan.spec.names) == 2 else
                    f"is value {scan.spec.ignore_index} meant to be that class? save its pixels as value {i}, or set "
                    "ignore_index in the class file")
            where = scan.spec.source if os.path.isfile(scan.spec.source) else root
            raise DatasetError(where, f"class {name!r} has no pixels while value {scan.spec.ignore_index} covers "
                                      f"{ignored:.1f} % of the mask pixels"
                                      f"{' (the masks hold only 0 and 255)' if binary_file else ''}; {hint}")
        if scan.pixels[i] == 0:
            scan.warnings.append(f"class {name!r} (value {i}) has no pixels in any of the {scan.samples} masks")
        elif scan.train_pixels is not None and scan.train_pixels[i] == 0:
            scan.warnings.append(f"class {name!r} (value {i}) has no pixels in the training split ({train_count} "
                                 "masks): the network cannot learn it")


def audit(records: Dict[str, Dict[str, Any]], mapped: Dict[str, Dict[int, int]], spec: ClassSpec, binary_255: bool,
          unknown: Dict[str, int], *, binary: bool = False, train: Optional[Sequence[str]] = None,
          root: str = "") -> FolderScan:
    """Count the classes of the good ``records`` (``mapped``: per record, raw value -> class, -1 ignore) and audit
    them (see the module docstring).

    Args:
        unknown: per record, its pixels of no class (mapped to ignore).
        binary: a ``--binary`` run (mixed 0/1 and 0/255 masks are refused).
        train: the keys of the training split's records.
        root: the dataset's root, for the messages.

    Raises:
        DatasetError: a class without pixels while the ignore value is common, or mixed binary masks (``binary``).
    """
    n = len(spec.names)
    scan = FolderScan(spec, binary_255, [0] * n, [0] * n, samples=len(records),
                      train_pixels=None if train is None else [0] * n)
    _count(scan, records, mapped, unknown, set(train or ()))
    _binary_mix(scan, records, binary, root)
    _empty_classes(scan, root, len(train or ()), _only_0_255(_index_values(records.values())))
    return scan
