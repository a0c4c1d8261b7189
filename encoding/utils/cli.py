"""Command-line helpers of the scripts: one-line errors, checked numbers, and the runner that reports failures.

:class:`OneLineParser` reports a bad option in one line (``prog: error: ...``, exit status 2); :func:`run_cli` runs
a script's ``main`` and turns its known failures into one line on stderr (exit status 1) and Ctrl-C into status 130.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, List, NoReturn, Optional

from .dist import end_worker, is_launched_worker

__all__ = ["EXIT_INTERRUPTED", "OneLineParser", "run_cli", "positive_int", "positive_float", "non_negative_int",
           "non_negative_float", "scales", "unit_float"]

#: Exit status after an interrupt (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def run_cli(prog: str, main: Callable[..., Any], argv: Optional[List[str]], known: tuple,
            interrupted: str = "interrupted", **kwargs: Any) -> int:
    """Run ``main(argv, **kwargs)``: the ``known`` failures become one line on stderr (``prog: error: ...``, exit
    status 1), Ctrl-C prints ``prog: interrupted`` (status 130); a ``SystemExit`` carrying a ``message`` (a run
    interrupted after saving its work) prints it and exits with its code. Returns the exit status (0 on success).

    Under ``torchrun`` the process ends here with that status (:func:`~encoding.utils.dist.end_worker`), past the
    interpreter's teardown."""
    status = _run(prog, main, argv, known, interrupted, **kwargs)
    if is_launched_worker():
        end_worker(status)
    return status


def _run(prog: str, main: Callable[..., Any], argv: Optional[List[str]], known: tuple, interrupted: str,
         **kwargs: Any) -> int:
    try:
        main(argv, **kwargs)
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: {interrupted}\n")
        return EXIT_INTERRUPTED
    except known as err:
        sys.stderr.write(f"{prog}: error: {str(err).splitlines()[0] if str(err) else type(err).__name__}\n")
        return getattr(err, "exit_status", 1)  # 2: an option value the run cannot use
    except SystemExit as stop:
        if not hasattr(stop, "message"):
            raise
        sys.stderr.write(f"{prog}: {stop.message}\n")
        return int(stop.code)
    return 0


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``prog: error: ...``, exit status 2), without the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _number(kind: Callable[[str], Any], minimum: Any, inclusive: bool) -> Callable[[str], Any]:
    """An argparse ``type`` accepting ``kind`` values ``> minimum`` (``>=`` when ``inclusive``)."""
    bound = f">= {minimum}" if inclusive else f"> {minimum}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not (value >= minimum if inclusive else value > minimum) or value != value:  # value != value: NaN
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        if value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


positive_int, positive_float = _number(int, 0, False), _number(float, 0.0, False)
non_negative_int, non_negative_float = _number(int, 0, True), _number(float, 0.0, True)


def scales(text: str) -> tuple:
    """Comma-separated positive numbers, e.g. ``0.75,1.25``."""
    try:
        values = tuple(float(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not s > 0 for s in values):
        raise argparse.ArgumentTypeError(f"scales must be positive numbers, got {text!r}")
    return values


def unit_float(text: str) -> float:
    """A number in ``[0, 1]``."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value
