"""``python -m encoding.datasets.scan DIR``: the scan of a folder dataset alone, before any training.

It finds the layout and the pairs, decodes every image and mask, audits the labels and prints the summary, the
audit's warnings and the class-pixel table; every bad file is named in one line (exit status 2), as ``train.py``
would refuse it. Nothing is written into ``DIR``.

    python -m encoding.datasets.scan mydata
    python -m encoding.datasets.scan mydata --binary --unknown-labels ignore --max-pixels 200000000
"""
from __future__ import annotations

import sys
from typing import List, Optional

from ...utils.cli import OneLineParser, arg, make_parser, positive_int, run_cli, unit_float
from ...utils.images import set_max_pixels
from .audit import UNKNOWN_LABELS

__all__ = ["SCAN_ARGS", "build_parser", "main", "cli"]


#: The scan's options (those of ``train.py`` that change what the scan accepts).
SCAN_ARGS = (
    arg("root", metavar="DIR", help="the dataset folder (train.py's --data-root)"),
    arg("--unknown-labels", choices=UNKNOWN_LABELS, default="error", help="values of no class"),
    arg("--binary", action="store_true", help="as train.py --binary: 0/255 masks are foreground 255"),
    arg("--val-fraction", type=unit_float, default=0.1, help="hold-out share (no val split)"),
    arg("--seed", type=int, default=1, help="the hold-out's seed (train.py's --seed)"),
    arg("--max-pixels", type=positive_int, default=None, metavar="N",
        help="refuse an image of more pixels (default: $ENCODING_MAX_PIXELS or 100000000)"),
    arg("--no-cache", action="store_true", help="read every file again (no scan cache)"),
)


def build_parser() -> OneLineParser:
    """The parser of :data:`SCAN_ARGS`."""
    return make_parser("python -m encoding.datasets.scan", SCAN_ARGS,
                       description="Scan a folder dataset: every bad file named, the labels audited.")


def main(argv: Optional[List[str]] = None) -> str:
    """Scan and return the printed report.

    Raises:
        DatasetError: the bad files, or the audit's refusal (one line).
    """
    from ..folder import FolderSegmentation  # the dataset package: read only when the scan runs
    args = build_parser().parse_args(argv)
    if args.max_pixels is not None:
        set_max_pixels(args.max_pixels)
    data = FolderSegmentation(args.root, split="train", mode="testval", val_fraction=args.val_fraction,
                              holdout_seed=args.seed, unknown_labels=args.unknown_labels, binary=args.binary,
                              scan_cache=not args.no_cache)
    splits = ", ".join(f"{name} {len(pairs)}" for name, pairs in data._split_pairs.items())
    held = f" (val: a hold-out of --val-fraction {args.val_fraction})" if data.holdout is not None else ""
    text = "\n".join([f"{data.root}: {data.layout} layout, {splits}{held}", data.scan.summary(), "",
                      data.scan.table()])
    print(text)
    return text


def cli(argv: Optional[List[str]] = None) -> int:
    """:func:`main` for the command line: an error is one line on stderr; returns the exit status."""
    return run_cli("python -m encoding.datasets.scan", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
