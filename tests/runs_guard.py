"""The test suite keeps its hands off a user's runs: :class:`RunsGuard` notices anything that creates, changes,
deletes, opens or lists a file under a folder (the checkout's ``runs/``, where ``train.py`` writes by default).

Two witnesses, because a test may act in this process or in a subprocess:

* an audit hook (:func:`sys.addaudithook`) records every ``open``, ``os.listdir``/``os.scandir``, ``os.mkdir``,
  ``os.rename``/``os.replace``, ``os.remove``/``os.rmdir`` and ``shutil.rmtree`` of this process under the folder;
* a snapshot of the folder (every path with its size and modification time), taken at the start and compared at the
  end, catches what a subprocess created, changed or deleted.

``tests/conftest.py`` watches ``<checkout>/runs`` for the whole session and fails the run when either witness saw
anything; ``tests/test_runs_guard.py`` shows both witnesses catch each kind of access.
"""
import os
import sys
from pathlib import Path
from typing import Dict, List, Tuple

#: Audit events whose first argument is a path (``os.rename``/``os.replace``: the first two).
EVENTS = {"open": 1, "os.listdir": 1, "os.scandir": 1, "os.mkdir": 1, "os.rename": 2, "os.remove": 1,
          "os.rmdir": 1, "shutil.rmtree": 1, "os.truncate": 1, "os.utime": 1, "os.chmod": 1}

Snapshot = Dict[str, Tuple[int, int]]


def snapshot(folder: Path) -> Snapshot:
    """Every file and folder under ``folder`` (relative path -> (size, mtime in ns)); empty if it does not exist."""
    found: Snapshot = {}
    if not folder.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            with_stat = os.lstat(path)
            found[os.path.relpath(path, folder)] = (with_stat.st_size, with_stat.st_mtime_ns)
    found["."] = (0, os.lstat(folder).st_mtime_ns)
    return found


class RunsGuard:
    """Watches ``folder`` from :meth:`start` on; :meth:`problems` lists what touched it (empty: nothing did)."""

    def __init__(self, folder: Path):
        self.folder = Path(os.path.abspath(folder))
        self.accesses: List[str] = []
        self.before: Snapshot = {}
        self._active = False

    def start(self) -> "RunsGuard":
        self.before = snapshot(self.folder)  # taken before the hook: the guard's own look is not counted
        self._active = True
        sys.addaudithook(self._hook)  # a hook cannot be removed: stop() silences it
        return self

    def stop(self) -> None:
        self._active = False

    def _inside(self, path) -> bool:
        if isinstance(path, int) or path is None:
            return False
        try:
            text = os.fsdecode(os.fspath(path))
        except TypeError:
            return False
        full = os.path.abspath(text)
        root = str(self.folder)
        return full == root or full.startswith(root + os.sep)

    def _hook(self, event: str, args) -> None:
        count = EVENTS.get(event)
        if not self._active or count is None:
            return
        for path in args[:count]:
            if self._inside(path):
                during = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
                self.accesses.append(f"{event} {os.fsdecode(os.fspath(path))}" + (f" ({during})" if during else ""))

    def problems(self) -> List[str]:
        """What touched the folder: this process's accesses, then what differs from the starting snapshot."""
        active, self._active = self._active, False  # the comparison's own look is not counted
        try:
            after = snapshot(self.folder)
        finally:
            self._active = active
        found = list(dict.fromkeys(self.accesses))
        found += [f"created {p}" for p in sorted(set(after) - set(self.before))]
        found += [f"deleted {p}" for p in sorted(set(self.before) - set(after))]
        found += [f"changed {p}" for p in sorted(set(after) & set(self.before)) if after[p] != self.before[p]]
        return found
