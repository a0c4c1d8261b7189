"""Each request's own ``sys.stderr`` / ``sys.stdout``, without swapping the process's.

The memory tool prints its progress to ``sys.stderr`` and its parser its errors there, so the Plan memory tab must
catch what one request's call prints. ``contextlib.redirect_stderr`` swaps the process-wide stream: with
``--concurrency-limit`` 2 or more (Gradio runs the handlers in threads) one visitor's lines went to another's
progress bar, and a plan that ended while another ran left ``sys.stderr`` pointing at the finished request's stream
(the server's log lost). Here the process's streams are replaced once by a :class:`Routed` stream, which writes to
the stream the current request named (:func:`routed`, held in a :class:`contextvars.ContextVar`: per thread and per
task) and, where none is named, to the stream it replaced.
"""
from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from typing import Any, Iterator, Optional, TextIO

__all__ = ["Routed", "install", "routed"]

_SINKS = {name: contextvars.ContextVar(f"encoding_app_{name}", default=None) for name in ("stderr", "stdout")}
_LOCK = threading.Lock()


class Routed:
    """A stand-in for ``sys.<name>``: text goes to the current request's stream (:func:`routed`), else to ``real``
    (the stream it replaced). Anything else (``fileno``, ``encoding``, ``isatty`` ...) is ``real``'s."""

    def __init__(self, name: str, real: TextIO) -> None:
        self._sink, self.real = _SINKS[name], real

    def _target(self) -> TextIO:
        return self._sink.get() or self.real

    def write(self, text: str) -> int:
        """Write ``text`` to the current request's stream, else to the real one."""
        return self._target().write(text)

    def writelines(self, lines: Any) -> None:
        """Write each of ``lines``."""
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        """Flush the current request's stream, else the real one."""
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def install() -> None:
    """Replace ``sys.stderr`` and ``sys.stdout`` by :class:`Routed` streams, once (a stream that is one already is
    kept); what nobody routes still reaches the stream replaced."""
    with _LOCK:
        for name in _SINKS:
            if not isinstance(getattr(sys, name), Routed):
                setattr(sys, name, Routed(name, getattr(sys, name)))


@contextlib.contextmanager
def routed(stderr: Optional[TextIO] = None, stdout: Optional[TextIO] = None) -> Iterator[None]:
    """Within the block, what this thread (this context) writes to ``sys.stderr`` / ``sys.stdout`` goes to
    ``stderr`` / ``stdout`` (``None``: left as it is); other threads' writes are untouched.

    Example:
        >>> import io
        >>> caught = io.StringIO()
        >>> with routed(stderr=caught):
        ...     print("progress", file=sys.stderr)
        >>> caught.getvalue()
        'progress\\n'
    """
    install()
    tokens = [(_SINKS[name], _SINKS[name].set(stream))
              for name, stream in (("stderr", stderr), ("stdout", stdout)) if stream is not None]
    try:
        yield
    finally:
        for sink, token in reversed(tokens):
            sink.reset(token)
