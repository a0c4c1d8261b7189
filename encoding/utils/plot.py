"""``python -m encoding.utils.plot RUN/log.csv [--out FILE]``: the training curves of a run as a PNG, finished or
not (:mod:`.curves` draws them; its names are importable from here too, as before)."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .cli import arg, make_parser
from .curves import CURVES_NAME, plot_log, read_log, save_figure, write_curves

__all__ = ["CURVES_NAME", "save_figure", "read_log", "plot_log", "write_curves", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m encoding.utils.plot``."""
    return make_parser("python -m encoding.utils.plot", (
        arg("log", metavar="LOG_CSV", help="a run's log.csv (runs/<dataset>/<model>/<checkname>/log.csv)"),
        arg("--out", default=None, help=f"the PNG to write (default: {CURVES_NAME} next to the log)"),
    ), description="Training curves of a run as a PNG")


def main(argv: Optional[List[str]] = None) -> int:
    """Draw the curves; a missing or garbled log is one line on stderr (exit status 1)."""
    args = build_parser().parse_args(argv)
    try:
        out = plot_log(args.log, args.out)
    except (ValueError, ImportError, OSError) as err:
        sys.stderr.write(f"python -m encoding.utils.plot: error: {str(err).splitlines()[0]}\n")
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
