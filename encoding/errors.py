"""The one base of the package's errors: :class:`EncodingError` and the exit statuses of the scripts.

Every error the package raises for a reason it can explain in one line (a bad option, an unreadable dataset, a
checkpoint of another network, a run that diverged) derives from :class:`EncodingError` and carries the exit status
a script ends with: :data:`EXIT_USAGE` (2) when the user or the configuration is wrong, :data:`EXIT_FAILURE` (1) when
the run itself failed. The classes keep their other bases (``ValueError``, ``RuntimeError``...), so code that
catches those still catches them.

The scripts (:func:`encoding.utils.cli.run_cli`) print an ``EncodingError`` (or an ``OSError`` about a file) as one
line, ``prog: error: <message>``, and exit with its status; any other exception is a bug and keeps its whole
traceback. ``--traceback`` (or ``ENCODING_TRACEBACK=1``) shows the traceback of the one-line errors too.

This module imports nothing of the package (a leaf): every module may import it.
"""
from __future__ import annotations

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_USAGE", "EncodingError", "UsageError", "MissingDependency",
           "RunInterrupted"]

#: Exit status of a run that failed (diverged, an unreadable file met during the run...).
EXIT_FAILURE = 1
#: Exit status of a user or configuration error (as argparse's own errors).
EXIT_USAGE = 2
#: Exit status after an interrupt (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


class EncodingError(Exception):
    """An error the package explains in one line; ``exit_status`` is what a script exits with.

    Subclasses set ``exit_status`` as a class attribute (:data:`EXIT_FAILURE` by default, :data:`EXIT_USAGE` for
    user and configuration errors)."""

    exit_status: int = EXIT_FAILURE


class UsageError(ValueError, EncodingError):
    """A value the user handed (an argument, an option, a file name) that cannot be used: the message names it;
    exit status 2. Also a ``ValueError``: it is a bad argument value."""

    exit_status = EXIT_USAGE


class MissingDependency(ImportError, EncodingError):
    """An optional library that a requested feature needs is not installed (the message says what to install);
    exit status 2."""

    exit_status = EXIT_USAGE


class RunInterrupted(SystemExit):
    """Ctrl-C, SIGTERM or SIGHUP stopped a run after it saved a resumable checkpoint; exit status 128 + signal (130
    for Ctrl-C).

    A ``SystemExit`` (not an :class:`EncodingError`): ``except Exception`` lets it through, as any request to exit.
    The scripts print its ``message`` in one line and exit with its ``code``.
    """

    def __init__(self, message: str, status: int = EXIT_INTERRUPTED) -> None:
        super().__init__(status)
        self.message = message
