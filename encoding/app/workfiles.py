"""The page's files of each request, in its working folder, and when they go.

A handler writes its results (the mask PNG and overlay, the memory report) into a fresh folder of the working folder
and returns their paths; Gradio copies each returned file into its own cache as it answers (``postprocess``) and
serves it from there, so the folder is needed only until then. :class:`WorkFolders` removes a refused request's
folder at once, and an answered request's folder :data:`KEEP_S` seconds after it ended or once :data:`KEEP_FOLDERS`
newer ones ended, whichever comes first (checked as each new request starts). An image an API client sent inline is
written to a folder of its own (:meth:`WorkFolders.inline`), which the handler removes once done with it, used or
refused (:meth:`WorkFolders.release`); one no handler took (another input refused) goes as an answered request's.
The whole working folder goes when the page stops (``python -m encoding.app``: Ctrl-C or SIGTERM).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from typing import Callable, Dict, Iterator, Set

__all__ = ["KEEP_S", "KEEP_FOLDERS", "WorkFolders", "work_folders"]

#: Seconds an answered request's folder stays (Gradio has copied its files long before).
KEEP_S = 60.0
#: The most answered requests' folders kept (the newest).
KEEP_FOLDERS = 32

_SHARED: Dict[str, "WorkFolders"] = {}
_SHARED_LOCK = threading.Lock()


class WorkFolders:
    """The request folders of one working folder (see the module's docstring).

    Args:
        workdir: the page's working folder.
        keep_s, keep: how long, and how many of, the answered requests' folders stay.
        clock: the time in seconds (``time.monotonic``; the tests' own).
    """

    def __init__(self, workdir: str, keep_s: float = KEEP_S, keep: int = KEEP_FOLDERS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.workdir, self.keep_s, self.keep, self.clock = workdir, keep_s, keep, clock
        self._ended: Dict[str, float] = {}  # folder -> when its request ended (an inline image's: when written)
        self._inline: Set[str] = set()
        self._lock = threading.Lock()

    def _remove(self, folder: str) -> None:
        with self._lock:
            self._ended.pop(folder, None)
            self._inline.discard(folder)
        shutil.rmtree(folder, ignore_errors=True)

    def prune(self) -> None:
        """Remove the folders ended more than ``keep_s`` ago, and all but the ``keep`` newest ended ones."""
        now = self.clock()
        with self._lock:
            ended = list(self._ended)[::-1]  # newest first: entered as they ended
            stale = [f for i, f in enumerate(ended) if i >= self.keep or now - self._ended[f] >= self.keep_s]
        for folder in stale:
            self._remove(folder)

    @contextlib.contextmanager
    def request(self) -> Iterator[str]:
        """A fresh folder for one request's files: removed at once if the block raises, else kept for Gradio to
        copy the files returned (:meth:`prune` removes it later). Older folders are pruned before and after."""
        self.prune()
        folder = tempfile.mkdtemp(dir=self.workdir)
        try:
            yield folder
        except BaseException:
            self._remove(folder)
            raise
        with self._lock:
            self._ended[folder] = self.clock()
        self.prune()  # at most ``keep``: this one, the newest, stays

    def inline(self, name: str) -> str:
        """A path ``name`` in a fresh folder of its own, for an image sent inline; :meth:`release` removes it."""
        self.prune()
        folder = tempfile.mkdtemp(dir=self.workdir)
        with self._lock:
            self._ended[folder] = self.clock()  # should no handler take it: pruned as an answered request's
            self._inline.add(folder)
        return os.path.join(folder, name)

    def release(self, path: object) -> None:
        """Remove the folder of ``path`` if it is an inline image's (:meth:`inline`); any other path is left."""
        if isinstance(path, str):
            folder = os.path.dirname(path)
            with self._lock:
                mine = folder in self._inline
            if mine:
                self._remove(folder)


def work_folders(workdir: str) -> WorkFolders:
    """The one :class:`WorkFolders` of ``workdir`` in this process (the tabs' handlers share it)."""
    key = os.path.realpath(workdir)
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = WorkFolders(workdir)
        return _SHARED[key]
