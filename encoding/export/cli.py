"""``python -m encoding.export --resume PATH --format onnx|exported [--output FILE] [--input-size H W] [--dynamic]``."""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from ..engine.loading import load_model
from ..utils.cli import OneLineParser, positive_int, run_cli
from .core import FORMATS, SUFFIXES, check_output, export_model

__all__ = ["build_parser", "main", "cli"]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m encoding.export``."""
    p = OneLineParser(prog="python -m encoding.export",
                      description="Export a trained network (torch.export, or ONNX) with its metadata (encoding)")
    p.add_argument("--resume", required=True, metavar="PATH",
                   help="train.py's checkpoint (model_best.pth / checkpoint.pth) or a preset name of model_list")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="onnx: an ONNX file (onnxruntime); exported: a torch.export ExportedProgram (.pt2)")
    p.add_argument("--output", default=None, metavar="FILE",
                   help="the model file (default: beside the checkpoint, model.onnx / model.pt2); metadata: FILE's "
                        "name with .json")
    p.add_argument("--input-size", type=positive_int, nargs=2, default=None, metavar=("H", "W"),
                   help="the traced input size (default: the checkpoint's training crop)")
    p.add_argument("--dynamic", action="store_true",
                   help="dynamic batch, height and width (default: the fixed shape 1 x 3 x H x W)")
    return p


def main(argv: Optional[List[str]] = None) -> List[str]:
    """Export as ``argv`` says; returns the paths written."""
    parser = build_parser()
    args = parser.parse_args(argv)
    output = args.output or os.path.join(os.path.dirname(os.path.abspath(args.resume)), "model" + SUFFIXES[args.format])
    inputs = [args.resume] if os.path.exists(args.resume) else []
    try:  # before the checkpoint is read: an output that would destroy it, or itself, is a bad option value
        check_output(output, inputs)
    except ValueError as err:
        parser.error(str(err))
    model = load_model(args.resume)
    written = export_model(model, output, args.format, args.input_size, args.dynamic, inputs=inputs)
    print(f"wrote {', '.join(written)}")
    return written


def cli(argv: Optional[List[str]] = None) -> int:
    """``main`` for the command line: an ``EncodingError`` is one line on stderr, a bug keeps its traceback
    (``--traceback`` shows them all); returns the exit status."""
    return run_cli("python -m encoding.export", main, argv)


if __name__ == "__main__":
    sys.exit(cli())
