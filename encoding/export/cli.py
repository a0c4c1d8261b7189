"""``python -m encoding.export --resume PATH [--format onnx|exported] [--output FILE] [--input-size H W]
[--static]``."""
from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import List, Optional

from ..inference.loading import load_model, network_files
from ..config.parser import build_parser as config_parser
from ..utils.cli import run_cli
from ..utils.files import source_files
from .core import SUFFIXES, check_output, export_model

__all__ = ["build_parser", "format_of", "default_folder", "main", "cli"]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m encoding.export``: generated from the option fields of :mod:`encoding.config`
    (:class:`~encoding.config.tools.ExportOptions` and ``--resume``, shared with ``train.py``)."""
    return config_parser("export")


def format_of(output: Optional[str]) -> str:
    """The format an output file's suffix names (``model.pt2``: ``exported``); ``onnx`` otherwise."""
    suffix = os.path.splitext(output or "")[1].lower()
    return next((name for name, known in SUFFIXES.items() if known == suffix), "onnx")


def default_folder(resume: str) -> str:
    """Where the export of ``--resume`` goes without ``--output``: beside a local checkpoint file or model folder;
    the current folder for a Hugging Face Hub id ``user/repo`` or a preset name (no local path: ``user/`` is no
    folder of the user's)."""
    return os.path.dirname(os.path.abspath(resume)) if os.path.exists(resume) else os.curdir


def main(argv: Optional[List[str]] = None) -> List[str]:
    """Export as ``argv`` says; returns the paths written."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.static and args.dynamic:
        parser.error("--static and --dynamic: give one (--static fixes the shape 1 x 3 x H x W; dynamic is the "
                     "default)")
    named = format_of(args.output) if os.path.splitext(args.output or "")[1].lower() in SUFFIXES.values() else None
    args.format = args.format or format_of(args.output)
    if named not in (None, args.format):  # an explicit --format wins; the file's name will mislead other tools
        sys.stderr.write(f"python -m encoding.export: note: --output {args.output} has the suffix of --format {named} "
                         f"and will hold --format {args.format} (name it *{SUFFIXES[args.format]})\n")
    output = args.output or os.path.join(default_folder(args.resume), "model" + SUFFIXES[args.format])
    inputs = source_files(args.resume)
    try:  # before the checkpoint is read: an output that would destroy it, or itself, is a bad option value
        check_output(output, inputs)
    except ValueError as err:
        parser.error(str(err))
    model = load_model(args.resume, trust_code=args.trust_code)
    inputs += network_files(model.info.options.get("model"))
    try:  # the folder a transformers: network was read from is an input too
        check_output(output, inputs)
    except ValueError as err:
        parser.error(str(err))
    if args.dynamic:
        message = "--dynamic is the default now (--static fixes the shape); the option will go"
        warnings.warn(message, FutureWarning, stacklevel=2)
        sys.stderr.write(f"python -m encoding.export: note: {message}\n")
    written = export_model(model, output, args.format, args.input_size, not args.static, inputs=inputs)
    print(f"wrote {', '.join(written)}")
    return written


def cli(argv: Optional[List[str]] = None) -> int:
    """``main`` for the command line: an ``EncodingError`` is one line on stderr, a bug keeps its traceback
    (``--traceback`` shows them all); returns the exit status."""
    return run_cli("python -m encoding.export", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
