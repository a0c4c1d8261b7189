"""The advice's traces simulated ahead, in a second process, while the tool simulates its table
(:class:`TracesAhead`).

A simulation runs on one core (torch's fake-tensor dispatch is Python), and most of the advice's time is the
forward-and-backward traces it needs besides the table's programs (:func:`~encoding.memory.advice.planned_traces`:
one sample and one crop step beyond the advice's point, and every further checkpointing policy). Those depend only
on the step, not on what the table simulates, so ``python -m encoding.memory --advise`` forks a process before its
first simulation that traces them on the second core, then simulates the confirmation's "one more sample" while
the first process simulates the advised batch. :func:`~encoding.memory.advice.advise` takes each from it (the same
events and peaks: the fork builds the same fake models and runs the same programs,
:func:`~encoding.memory.advice.advice_peaks`) and simulates itself whatever it does not get.

A process is forked only where that is safe and pays: Linux (``fork``), at least two CPUs available to this
process, no other Python thread running (a fork copies only the calling thread), and before the first simulation:
autograd refuses backward passes in a process forked after its engine started its device threads (a simulated
step does); such a second process says so at once, and everything is simulated in the first, as without it.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .advice import advice_peaks, planned_traces

__all__ = ["TracesAhead", "can_fork", "traces_ahead"]

Key = Tuple[str, int, str, int]
#: How long the first process waits for one answer before it simulates the point itself (a trace takes seconds).
_PATIENCE_S = 600


def can_fork() -> bool:
    """A second process can trace beside this one: ``fork`` (Linux), two or more CPUs available to this process,
    no other Python thread."""
    return (sys.platform.startswith("linux") and len(os.sched_getaffinity(0)) >= 2
            and threading.active_count() == 1)


class TracesAhead:
    """The traces of ``keys`` simulated in a forked process (started here), handed out by :meth:`take`; after them
    the process simulates the peaks asked of it (:meth:`ask_peak`, :meth:`peak`) until :meth:`close`.

    Args:
        spec_for, num_devices, round_to, backend: as for :func:`~encoding.memory.advice.advise`.
        keys: ``(policy, crop, strategy, share)`` of the traces, in the order they are simulated.
        first: the ``(policy, crop)`` of the simulator the advice reuses (the table's).

    Attributes:
        taken: traces and peaks handed out.
        cpu_s: CPU seconds the second process spent up to its last answer.
        failed: why the second process stopped (``None`` while it works).
    """

    def __init__(self, spec_for: Callable[[int, str], Any], keys: Sequence[Key], num_devices: int, round_to: int,
                 backend: str, first: Tuple[str, int]) -> None:
        self._pending = set(keys)
        self._received: Dict[tuple, Any] = {}  # ("trace", key) -> trace, ("peak", key) -> bytes
        self.taken, self.cpu_s, self.failed = 0, 0.0, None
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe()
        with warnings.catch_warnings():  # Python 3.12+ warns of torch's idle kernel threads, which the child leaves be
            warnings.simplefilter("ignore", DeprecationWarning)
            self._process = context.Process(target=_work, daemon=True, name="encoding-traces-ahead",
                                            args=(child, spec_for, list(keys), num_devices, round_to, backend, first))
            self._process.start()
        child.close()

    def take(self, key: Key) -> Optional[Tuple[int, List[tuple]]]:
        """The trace of ``key`` (waiting for it if the second process is on its way to it), or ``None`` where it
        will not come (not planned, or the process stopped)."""
        if key not in self._pending:
            return None
        self._pending.discard(key)
        return self._answer(("trace", key))

    def ask_peak(self, key: Key) -> bool:
        """Ask the second process for the heaviest device's simulated peak at ``key`` (after the traces it has not
        sent yet); ``False`` where it stopped."""
        if self.failed is not None:
            return False
        try:
            self._conn.send(key)
        except OSError:
            self.failed = "it ended"
            return False
        return True

    def peak(self, key: Key) -> Optional[int]:
        """The peak asked with :meth:`ask_peak` (waiting for it), or ``None`` where the process stopped."""
        return self._answer(("peak", key))

    def _answer(self, wanted: tuple) -> Any:
        while wanted not in self._received and self.failed is None:
            try:
                if not self._conn.poll(_PATIENCE_S):
                    self.failed = f"no answer in {_PATIENCE_S} s"
                    break
                kind, key, value, self.cpu_s = self._conn.recv()
            except (EOFError, OSError):
                self.failed = "it ended"
                break
            if kind == "error":
                self.failed = value
            else:
                self._received[kind, key] = value
        value = self._received.pop(wanted, None)
        self.taken += value is not None
        return value

    def close(self) -> None:
        """Stop the second process (it may still trace keys nobody asked for) and wait for it."""
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()
        self._conn.close()

    def __enter__(self) -> "TracesAhead":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _work(conn: Any, spec_for: Callable[[int, str], Any], keys: List[Key], num_devices: int, round_to: int,
          backend: str, first: Tuple[str, int]) -> None:
    """The second process: each trace sent as it is done, then each peak asked; an error sent as one line."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the first process's to handle (it stops this one)
    warnings.simplefilter("ignore")  # the first process shows the simulation's warnings
    try:
        probe = torch.ones((), requires_grad=True)
        (probe * 2).backward()  # autograd may refuse a forked process (above): find out before simulating
        peaks = advice_peaks(spec_for, num_devices, round_to, backend, first)
        for key in keys:
            while conn.poll():  # a peak asked comes first: the advice waits for it
                _send_peak(conn, peaks, conn.recv())
            conn.send(("trace", key, peaks.trace(*key, head=True), time.process_time()))
        while True:
            _send_peak(conn, peaks, conn.recv())
    except EOFError:  # the first process closed its end
        pass
    except Exception as error:  # noqa: BLE001 - the first process simulates what it did not get
        try:
            conn.send(("error", None, f"{type(error).__name__}: {error}", time.process_time()))
        except OSError:
            pass
    finally:
        conn.close()


def _send_peak(conn: Any, peaks: Any, key: Key) -> None:
    conn.send(("peak", key, peaks.simulated(*key), time.process_time()))


def traces_ahead(spec_for: Callable[[int, str], Any], strategies: Sequence[str], num_devices: int, batch: int,
                 crop: int, round_to: int, backend: str, policies: Sequence[str],
                 first_policy: str) -> Optional[TracesAhead]:
    """The traces :func:`~encoding.memory.advice.advise` will ask for (:func:`~encoding.memory.advice.planned_traces`)
    started in a second process, or ``None`` where none can be forked (:func:`can_fork`) or none is planned."""
    keys = planned_traces(strategies, num_devices, batch, crop, policies)
    if not keys or not can_fork():
        return None
    return TracesAhead(spec_for, keys, num_devices, round_to, backend, (first_policy, crop))
