"""``python -m encoding.datasets.prepare NAME``: download, verify, extract and convert a dataset once.

Preparation is apart from loading: everything that needs a parser (SBD's MATLAB files, PASCAL-Context's RLE JSON,
COCO's instances) is converted here, once, into label PNGs that the dataset classes read at train time. The
conversions use SciPy and pycocotools, installed with the ``prepare`` extra (``pip install "encoding[prepare]"``).

Every dataset takes ``--root`` (default: the data root), ``--overwrite`` and ``--no-progress``; those that verify
files also ``--checksum NAME=DIGEST`` (``NAME`` one of the dataset's file names; ``NAME=none`` skips it), downloadable
ones ``--download-dir`` and ``--mirror DIR_OR_URL``. The ``scripts/prepare_*.py`` files are thin wrappers of this
command.

Example:
    python -m encoding.datasets.prepare ade20k --root /data --with-test
    python -m encoding.datasets.prepare pascal --no-voc
    python -m encoding.datasets.prepare citys --zips ~/Downloads
"""
from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ...errors import EXIT_FAILURE, EncodingError
from ...utils.cli import Arg, add_arguments, arg, make_parser, non_negative_int, positive_int, traceback_requested
from ...utils.files import parse_checksum
from ..layout import SHAPES_DEFAULT_NUM_TRAIN, SHAPES_DEFAULT_NUM_VAL, SHAPES_DEFAULT_SEED
from .download import Resource
from .steps import (ADE20K_RESOURCES, CITYS_INSTRUCTIONS, CITYS_PACKAGES, COCO_RESOURCES, CONTEXT_RESOURCES,
                    VOC_RESOURCES, prepare_ade20k, prepare_citys, prepare_coco, prepare_pascal,
                    prepare_pcontext, prepare_shapes)

__all__ = ["PREPARERS", "build_parser", "checksum_overrides", "run_step", "main", "script_main"]


class Preparer(NamedTuple):
    """How the CLI prepares one dataset.

    Attributes:
        help: one line for ``--help``.
        downloads: whether it fetches files (adds ``--download-dir`` / ``--mirror``).
        options: the dataset's own options (after :data:`ROOT`, :data:`FETCH`, :data:`COMMON`).
        run: the prepare call for the parsed arguments; returns what to print as ``ready:``.
        files: the names of the files it verifies, the ``NAME`` of ``--checksum NAME=DIGEST`` (none: ``--checksum``
            is refused).
    """

    help: str
    downloads: bool
    options: Tuple[Arg, ...]
    run: Callable[[argparse.Namespace], Any]
    files: Tuple[str, ...] = ()


#: ``--root``: every dataset.
ROOT = arg("--root", default=None, help="data root (default: $ENCODING_DATA or ~/.encoding/data)")
#: The options of the datasets that download their files.
FETCH = (arg("--download-dir", default=None, help="where archives are kept (default: <root>/downloads)"),
         arg("--mirror", default=None,
             help="folder or base URL holding the archives under their original names (offline copies, mirrors)"))
#: The options every dataset has after ``--root`` (and :data:`FETCH`); ``--checksum`` names one of
#: :attr:`Preparer.files` (refused for a dataset without files: ``shapes``).
COMMON = (arg("--checksum", action="append", default=[], metavar="NAME=DIGEST",
              help="override the expected checksum of one of the dataset's files, e.g. NAME=sha256:<hex> "
                   "(NAME=none: skip)"),
          arg("--overwrite", action="store_true", help="download / extract / convert again"),
          arg("--no-progress", action="store_true", help="no progress bars"))


def _whole(bounded: Callable[[str], int]) -> Callable[[str], int]:
    """``bounded`` (a bounded whole-number type of :mod:`encoding.utils.cli`), with argparse's own ``invalid int
    value: 'x'`` for a value that is not a whole number."""
    def parse(text: str) -> int:
        int(text)  # a ValueError here is argparse's "invalid int value"
        return bounded(text)

    parse.__name__ = "int"
    return parse


def _names(resources: Dict[str, Resource]) -> Tuple[str, ...]:
    """The file names of a dataset's resources (what ``--checksum NAME=...`` may name)."""
    return tuple(resource.filename for resource in resources.values())


def _fetch_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    """The keyword arguments every downloading ``prepare_<name>`` function takes."""
    return dict(download_dir=args.download_dir, mirror=args.mirror, checksums=checksum_overrides(args.checksum),
                overwrite=args.overwrite, progress=not args.no_progress)


def _citys(args: argparse.Namespace) -> Any:
    return prepare_citys(args.root, zips=args.zips, checksums=checksum_overrides(args.checksum),
                         overwrite=args.overwrite, progress=not args.no_progress)


def _shapes(args: argparse.Namespace) -> Any:
    return prepare_shapes(args.root, seed=args.seed, num_train=args.num_train, num_val=args.num_val,
                          overwrite=args.overwrite, progress=not args.no_progress)


#: CLI name -> how to prepare it (``pascal`` prepares both ``pascal_voc`` and ``pascal_aug``).
PREPARERS: Dict[str, Preparer] = {
    "ade20k": Preparer("ADE20K (ADEChallengeData2016, ~923 MB)", True,
                       (arg("--with-test", action="store_true", help="also fetch the unlabelled test images"),),
                       lambda a: prepare_ade20k(a.root, with_test=a.with_test, **_fetch_kwargs(a)),
                       _names(ADE20K_RESOURCES)),
    "pascal": Preparer("PASCAL VOC 2012 (pascal_voc) and SBD (pascal_aug; .mat labels converted to PNGs)", True,
                       (arg("--no-voc", action="store_true", help="skip VOC 2012"),
                        arg("--no-aug", action="store_true", help="skip the SBD augmented set")),
                       lambda a: prepare_pascal(a.root, voc=not a.no_voc, aug=not a.no_aug, **_fetch_kwargs(a)),
                       _names(VOC_RESOURCES)),
    "pcontext": Preparer("VOC 2010 + PASCAL-Context's trainval_merged.json, converted to 59-class PNGs", True,
                         (), lambda a: prepare_pcontext(a.root, **_fetch_kwargs(a)), _names(CONTEXT_RESOURCES)),
    "citys": Preparer("Cityscapes from the two zips downloaded by hand (login-gated)", False,
                      (arg("--zips", default=None,
                           help="folder holding gtFine_trainvaltest.zip and leftImg8bit_trainvaltest.zip"),),
                      _citys, CITYS_PACKAGES),
    "coco": Preparer("COCO 2017 (~19 GB) and its 21-class (VOC categories) masks", True,
                     (arg("--no-masks", action="store_true", help="only download and extract"),),
                     lambda a: prepare_coco(a.root, build_masks=not a.no_masks, **_fetch_kwargs(a)),
                     _names(COCO_RESOURCES)),
    "shapes": Preparer("the embedded shapes dataset (also generated on first use)", False,
                       (arg("--seed", type=_whole(non_negative_int), default=SHAPES_DEFAULT_SEED),
                        arg("--num-train", type=_whole(positive_int), default=SHAPES_DEFAULT_NUM_TRAIN),
                        arg("--num-val", type=_whole(positive_int), default=SHAPES_DEFAULT_NUM_VAL)),
                       _shapes),
}


def _arguments(preparer: Preparer) -> Tuple[Arg, ...]:
    """The options of one dataset, in ``--help`` order: ``--root``, the fetch options when it downloads, the common
    ones, its own."""
    return (ROOT, *(FETCH if preparer.downloads else ()), *COMMON, *preparer.options)


def build_parser() -> argparse.ArgumentParser:
    """The CLI: one sub-command per entry of :data:`PREPARERS` (a bad option is one line, exit status 2)."""
    parser = make_parser("python -m encoding.datasets.prepare", (), description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="name", required=True, metavar="NAME")
    for name, preparer in PREPARERS.items():
        add_arguments(commands.add_parser(name, help=preparer.help, description=preparer.help), _arguments(preparer))
    return parser


def _checksum_override(item: str, names: Optional[Sequence[str]]) -> Tuple[str, Optional[str]]:
    """One ``--checksum NAME=DIGEST`` as ``(name, digest or None)``; ``SystemExit`` (one line naming it) if bad."""
    name, sep, digest = item.partition("=")
    if not sep or not name or not digest:
        raise SystemExit(f"error: --checksum expects NAME=DIGEST, got {item!r}")
    if names is not None and not names:
        raise SystemExit(f"error: --checksum {item!r}: this dataset has no file to verify")
    if names is not None and name not in names:
        raise SystemExit(f"error: --checksum {item!r}: {name!r} is not one of the dataset's files "
                         f"({', '.join(names)})")
    if digest.lower() == "none":
        return name, None
    try:
        parse_checksum(digest)
    except ValueError as e:
        raise SystemExit(f"error: --checksum {item!r}: {e}") from None
    return name, digest


def checksum_overrides(items: Sequence[str], names: Optional[Sequence[str]] = None) -> Dict[str, Optional[str]]:
    """Parse ``NAME=DIGEST`` options (``NAME=none`` disables verification of that file).

    Args:
        items: the ``--checksum`` values.
        names: the file names ``NAME`` may be (``None``: any; empty: no ``--checksum`` is accepted).

    Raises:
        SystemExit: one line naming the bad ``--checksum``: not ``NAME=DIGEST``, a ``NAME`` not in ``names`` (or
            any, when ``names`` is empty), or a digest whose algorithm cannot be told.
    """
    return dict(_checksum_override(item, names) for item in items)


def run_step(step: Callable[[], Any], show_traceback: bool = False) -> int:
    """Run a prepare step: print ``ready: <path>`` for each result and return 0; an
    :class:`~encoding.errors.EncodingError` or an ``OSError`` prints ``error: <message>`` (its traceback too with
    ``show_traceback``) and returns its exit status; anything else (a bug) keeps its traceback."""
    try:
        result = step()
    except (EncodingError, OSError) as e:
        if show_traceback:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "exit_status", EXIT_FAILURE)
    for path in result if isinstance(result, (list, tuple)) else [result]:
        print(f"ready: {path}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """Prepare the dataset named by the first argument; returns the exit status (2: Cityscapes instructions).
    ``--traceback`` (or ``ENCODING_TRACEBACK=1``) shows the traceback of an error."""
    show, argv = traceback_requested(argv)
    args = build_parser().parse_args(argv)
    if args.name == "citys" and args.zips is None:
        print(CITYS_INSTRUCTIONS)
        return 2
    checksum_overrides(getattr(args, "checksum", []), PREPARERS[args.name].files)  # refused before any work
    return run_step(lambda: PREPARERS[args.name].run(args), show)


def script_main(name: str) -> Callable[[Optional[List[str]]], int]:
    """The ``main(argv=None)`` of ``scripts/prepare_<name>.py``: :func:`main` with ``name`` put first."""
    def script(argv: Optional[List[str]] = None) -> int:
        return main([name, *(sys.argv[1:] if argv is None else argv)])

    script.__doc__ = f"``python -m encoding.datasets.prepare {name}`` with these arguments."
    return script

