"""Command-line helpers of the scripts: one-line errors, checked numbers, parsers from tables, and the runner that
reports failures.

:class:`OneLineParser` reports a bad option in one line (``prog: error: ...``, exit status 2); :func:`run_cli` runs
a script's ``main`` and turns its :class:`~encoding.errors.EncodingError` (and ``OSError``) into one line on stderr
with the error's exit status, Ctrl-C into status 130, and keeps the whole traceback of anything else (a bug).

A tool below :mod:`encoding.config` (the dataset preparation and scan, the curves, the configuration-file finder)
declares its options once, as a table of :func:`arg` entries, and gets its parser from :func:`make_parser`;
:func:`add_arguments` is the one place such a table becomes arguments (the scripts' options are the fields of
:mod:`encoding.config.groups`, turned into a parser by :func:`encoding.config.build_parser`).
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, List, Mapping, NoReturn, Optional, Tuple, TypeVar

from ..errors import EXIT_FAILURE, EXIT_INTERRUPTED, EncodingError, RunInterrupted
from .dist import end_worker, is_launched_worker, launched_world_size

__all__ = ["EXIT_INTERRUPTED", "TRACEBACK_ENV", "TRACEBACK_FLAG", "OneLineParser", "run_cli", "traceback_requested",
           "Arg", "arg", "add_arguments", "make_parser", "positive_int", "positive_float", "non_negative_int", "non_negative_float", "scales", "unit_float"]

#: The option that shows the traceback of a one-line error (every script; :func:`run_cli` takes it out of argv).
TRACEBACK_FLAG = "--traceback"
#: ``ENCODING_TRACEBACK=1`` does the same for every script.
TRACEBACK_ENV = "ENCODING_TRACEBACK"


def run_cli(prog: str, main: Callable[..., Any], argv: Optional[List[str]], known: tuple = (),
            interrupted: str = "interrupted", **kwargs: Any) -> int:
    """Run ``main(argv, **kwargs)`` and return the exit status (0 on success).

    * an :class:`~encoding.errors.EncodingError` or an ``OSError`` (a file), or one of the ``known`` types, is one
      line on stderr (``prog: error: ...``) and its ``exit_status`` (2: a user or configuration error; 1: the run
      failed, an ``OSError``);
    * :class:`~encoding.errors.RunInterrupted` (a run interrupted after saving its work) prints its message and exits
      with its code; Ctrl-C elsewhere prints ``prog: <interrupted>`` (status 130);
    * any other exception is a bug: its whole traceback is printed (status 1), never cut to one line.

    ``--traceback`` in ``argv`` (taken out before ``main`` sees it) or ``ENCODING_TRACEBACK=1`` prints the traceback
    of the one-line errors too. Under ``torchrun`` the process ends here with the status
    (:func:`~encoding.utils.dist.end_worker`), past the interpreter's teardown."""
    show, argv = traceback_requested(argv)
    status = _run(prog, main, argv, (EncodingError, OSError, *known), interrupted, show, **kwargs)
    if is_launched_worker():
        end_worker(status)
    return status


def traceback_requested(argv: Optional[List[str]]) -> Tuple[bool, List[str]]:
    """``(whether the traceback of one-line errors is wanted, argv without --traceback)``: :data:`TRACEBACK_FLAG`
    in ``argv`` (default: ``sys.argv[1:]``) or :data:`TRACEBACK_ENV` set to anything but ``0``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    show = TRACEBACK_FLAG in argv or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")
    return show, [arg for arg in argv if arg != TRACEBACK_FLAG]


def _run(prog: str, main: Callable[..., Any], argv: List[str], known: tuple, interrupted: str, show: bool,
         **kwargs: Any) -> int:
    try:
        main(argv, **kwargs)
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: {interrupted}\n")
        return EXIT_INTERRUPTED
    except RunInterrupted as stop:
        sys.stderr.write(f"{prog}: {stop.message}\n")
        return int(stop.code)
    except known as err:
        if show:
            traceback.print_exc()
        sys.stderr.write(f"{prog}: error: {str(err).splitlines()[0] if str(err) else type(err).__name__}\n")
        return getattr(err, "exit_status", EXIT_FAILURE)
    except Exception as err:  # a bug: its whole story
        traceback.print_exc()
        sys.stderr.write(f"{prog}: {_unexpected(err)}\n")
        return EXIT_FAILURE
    return 0


def _unexpected(err: Exception) -> str:
    """What an unexpected error is: a bug, unless another process of the same ``torchrun`` job may have failed
    first (a rank that stops on a bad file closes its connections: the others' next collective fails here)."""
    if launched_world_size() < 2:
        return "unexpected error (a bug: please report it with the traceback above)"
    return (f"unexpected error on rank {os.environ.get('RANK', '?')} ({type(err).__name__}); in a job of several "
            "processes another process's failure (its error is in its own output, above or in its log) breaks this "
            "one's collectives: if none failed first, it is a bug: please report it with the traceback above")


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``prog: error: ...``, exit status 2), without the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


@dataclass(frozen=True)
class Arg:
    """One command-line argument as data.

    Attributes:
        flags: its option strings (``"--seed"``), or its name when it is a positional (``"root"``).
        keywords: argparse's keywords (``help``, ``default``, ``type``, ``choices``, ``action``, ``metavar`` ...).
    """

    flags: Tuple[str, ...]
    keywords: Mapping[str, Any]


def arg(*flags: str, **keywords: Any) -> Arg:
    """An :class:`Arg`, spelled as argparse's call: ``arg("--seed", type=int, default=1, help="the seed")``."""
    return Arg(flags, MappingProxyType(dict(keywords)))


#: What takes arguments: a parser, a sub-parser, an argument group.
Target = TypeVar("Target", bound=argparse._ActionsContainer)


def add_arguments(parser: Target, args: Iterable[Arg]) -> Target:
    """Add each of ``args``, in order, to ``parser`` (a parser, a sub-parser or an argument group); returns it."""
    for item in args:
        parser.add_argument(*item.flags, **item.keywords)
    return parser


def make_parser(prog: str, args: Iterable[Arg], description: Optional[str] = None,
                **settings: Any) -> OneLineParser:
    """A :class:`OneLineParser` named ``prog`` with the arguments ``args``; ``settings``: more ``ArgumentParser``
    keywords (``formatter_class``, ``add_help``). Its sub-parsers are one-line parsers too."""
    return add_arguments(OneLineParser(prog=prog, description=description, **settings), args)


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
    """Comma-separated positive finite numbers, e.g. ``0.75,1.25`` (``inf`` is refused here, not by a later
    ``OverflowError``)."""
    try:
        values = tuple(float(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not 0 < s < float("inf") for s in values):
        raise argparse.ArgumentTypeError(f"expected positive finite numbers, got {text!r}")
    return values


def unit_float(text: str) -> float:
    """A number in ``[0, 1]``."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value
