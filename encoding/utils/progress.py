"""The one progress-bar policy: :func:`progress_bar` makes every bar of the library (training, evaluation, data
preparation, checksums).

* On a terminal: an ordinary tqdm bar (redrawn in place with carriage returns).
* Not on a terminal (piped into a file, a batch scheduler's log): no carriage returns, one plain line each time
  another ``step`` percent is done (default 10), or every 60 s when the total is unknown, and a last line when it
  closes.
* ``ENCODING_PROGRESS=bar`` / ``lines`` / ``off`` forces one of the three.

A leaf module (imports nothing of ``encoding``), so that every layer may use it.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Iterable, Optional

from tqdm.auto import tqdm as _bar
from tqdm.std import tqdm as _plain

__all__ = ["progress_bar", "progress_style", "LineProgress", "PROGRESS_STYLES"]

#: The values of ``ENCODING_PROGRESS``.
PROGRESS_STYLES = ("bar", "lines", "off")


def progress_style(file: Any = None) -> str:
    """``"bar"`` when ``file`` (default ``sys.stderr``) is a terminal, else ``"lines"``; ``ENCODING_PROGRESS``
    overrides it (one of :data:`PROGRESS_STYLES`)."""
    forced = os.environ.get("ENCODING_PROGRESS", "").strip().lower()
    if forced:
        if forced not in PROGRESS_STYLES:
            raise ValueError(f"ENCODING_PROGRESS={forced!r}: expected one of {', '.join(PROGRESS_STYLES)}")
        return forced
    file = sys.stderr if file is None else file
    try:
        return "bar" if file.isatty() else "lines"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return "lines"


class LineProgress(_plain):
    """A tqdm that writes whole lines, never a carriage return: one per ``step`` percent done (or every
    ``interval`` seconds without a total), and the last state when it closes."""

    def __init__(self, *args: Any, step: float = 10.0, interval: float = 60.0, **kwargs: Any) -> None:
        self._step, self._interval, self._shown, self._shown_n = step, interval, None, None
        kwargs.update(mininterval=0.0, miniters=1, dynamic_ncols=False, ncols=kwargs.get("ncols") or 100)
        super().__init__(*args, **kwargs)

    def _bucket(self) -> int:
        if self.total:
            return int(100.0 * self.n / self.total // self._step)
        now = time.time()
        return int((now - getattr(self, "start_t", now)) // self._interval)

    def display(self, msg: Optional[str] = None, pos: Optional[int] = None) -> bool:
        if msg is not None:  # tqdm clearing its line: nothing to clear
            return True
        bucket = self._bucket()
        if bucket != self._shown:
            self._write()
            self._shown = bucket
        return True

    def _write(self) -> None:
        self.fp.write(self.__str__().strip() + "\n")
        self.fp.flush()
        self._shown_n = self.n

    def clear(self, nolock: bool = False) -> None:  # nothing on screen to clear
        pass

    def moveto(self, n: int) -> None:  # lines never move the cursor
        pass

    def close(self) -> None:
        if self.disable:
            return
        if self._shown_n != self.n:
            self._write()
        self.disable = True
        self._decr_instances(self)


def progress_bar(iterable: Optional[Iterable] = None, *, disable: bool = False, file: Any = None,
                 **kwargs: Any) -> Any:
    """A tqdm bar (same arguments) drawn as the policy of this module says: a bar on a terminal, plain lines
    otherwise, nothing with ``disable`` or ``ENCODING_PROGRESS=off``.

    Example:
        >>> for batch in progress_bar(range(3), desc="eval", disable=True):
        ...     pass
    """
    style = "off" if disable else progress_style(file)
    if style == "lines":
        return LineProgress(iterable, file=file, **kwargs)
    return _bar(iterable, disable=style == "off", file=file, **kwargs)
