"""Stopping a run cleanly: :class:`GracefulInterrupt` turns Ctrl-C, SIGTERM and SIGHUP into a request the loops
poll, and :class:`Interrupted` is what they raise after the current iteration (:mod:`.loop`, :mod:`.hooks`)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Dict, Optional

from ..errors import EncodingError
from ..utils.dist import is_dist_avail_and_initialized, reduce_across_processes

__all__ = ["Interrupted", "GracefulInterrupt"]


class Interrupted(EncodingError):
    """A stop was requested (:class:`GracefulInterrupt`); raised after a whole iteration, never in the middle of one.

    Attributes:
        epoch: the running epoch.
        iteration: how many training iterations of ``epoch`` are done (resume there); ``None`` when the stop came
            during evaluation, i.e. after the whole training epoch.
    """

    def __init__(self, epoch: int, iteration: Optional[int]) -> None:
        where = f"iteration {iteration}" if iteration is not None else "evaluation"
        super().__init__(f"interrupted in epoch {epoch} at {where}")
        self.epoch, self.iteration = epoch, iteration


class GracefulInterrupt:
    """Context manager turning the first SIGINT (Ctrl-C), SIGTERM or SIGHUP into a request polled by the loops; a
    second one, more than ``DUPLICATE_S`` seconds later, exits the process at once with status 128 + signal.

    Use ``stop=handler.poll`` in :func:`train_one_epoch` (``requested`` in :func:`evaluate`): they raise
    :class:`Interrupted` after the current iteration, so the caller can save a resumable checkpoint. Under
    ``torch.distributed``, :meth:`poll` answers what every process reported to one tiny all-reduce, so every rank stops
    at the same iteration even when only one got the signal (or got it while the reduce ran: the next poll). A repeat
    within ``DUPLICATE_S`` counts as the same request: a terminal's Ctrl-C reaches each ``torchrun`` worker directly and
    again through ``torchrun``. Outside the main thread (where signal handlers cannot be installed) it does nothing.
    """

    SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
    DUPLICATE_S = 2.0

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._when = 0.0
        self._previous: Dict[int, Any] = {}

    def requested(self) -> bool:
        """Whether a stop signal arrived (in this process)."""
        return self.signum is not None

    def poll(self) -> bool:
        """Whether a stop signal arrived in any process (call it at the same points on every rank)."""
        agreed = int(reduce_across_processes(self.signum or 0, "max")) if is_dist_avail_and_initialized() else None
        self.signum = agreed or self.signum  # a handler that ran as the reduce returned: counted at the next poll
        return self.requested() if agreed is None else bool(agreed)

    @property
    def exit_status(self) -> int:
        """128 + the signal number, as shells report a process ended by that signal."""
        return 128 + int(self.signum or signal.SIGINT)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            if time.monotonic() - self._when < self.DUPLICATE_S:
                return
            sys.stderr.write(f"second {signal.Signals(signum).name}: exiting now, without saving\n")
            sys.stderr.flush()
            os._exit(128 + signum)
        self.signum, self._when = signum, time.monotonic()
        sys.stderr.write(f"\n{signal.Signals(signum).name}: finishing the current iteration and saving a checkpoint "
                         "(Ctrl-C again to exit now)\n")
        sys.stderr.flush()

    def __enter__(self) -> "GracefulInterrupt":
        if threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous = {}
