"""How the page answers a request that fails: a message on the page (``gradio.Error``), never a stack trace, and
the server keeps serving; and the one queue group of the handlers that compute (:data:`COMPUTE`)."""
from __future__ import annotations

import functools
import sys
import traceback
from typing import Any, Callable

from ..errors import EncodingError

__all__ = ["COMPUTE", "one_line", "on_page"]

#: The concurrency group of the handlers that compute (segment, plan): together they run at most
#: ``--concurrency-limit`` requests at a time (Gradio's ``concurrency_id``).
COMPUTE = "compute"


def one_line(err: BaseException) -> str:
    """The first line of ``err``'s message (its type's name when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def on_page(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a Gradio handler whose errors are one-line messages on the page: a user's error (an
    :class:`~encoding.errors.EncodingError`, ``ValueError``, ``OSError``) as it is; anything else (a bug) with its
    type, its traceback going to the server's log."""
    import gradio as gr

    @functools.wraps(fn)
    def answer(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except gr.Error:
            raise
        except (EncodingError, ValueError, OSError) as err:
            raise gr.Error(one_line(err)) from None
        except Exception as err:  # a bug: the page says so, the log keeps the traceback
            traceback.print_exc(file=sys.stderr)
            raise gr.Error(f"unexpected error ({type(err).__name__}): {one_line(err)}") from None

    return answer
