"""One run per output directory: a lock file with the owner's pid, stale-lock detection and leftover cleanup.

:class:`RunDirLock` creates ``<dir>/.lock`` exclusively (``O_EXCL``) and writes ``pid host`` into it. A second run
into the same directory is refused with :class:`RunDirLocked` naming the directory and the pid holding it. A lock
left by a process that no longer exists on this host (``kill -9``, power loss) is stale: it is taken over. Taking
the lock is also the writability check of the directory: a read-only directory fails here, before any training.

:func:`run_directory` is where a run writes (``<output-dir>/<dataset>/<model>/<checkname>``); :func:`run_lock` is
the lock a run takes there: on the main process only (rank 0 under ``torchrun``).

While the lock is held, :func:`remove_stale_temp_files` deletes the temporary files of interrupted atomic writes
(``.<name>.<hex>.tmp``, see :func:`encoding.utils.files.atomic_write`): nobody else can be writing them.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
from typing import List, Optional, Tuple

__all__ = ["RunDirLocked", "RunDirLock", "pid_alive", "remove_stale_temp_files", "run_directory", "run_lock",
           "LOCK_NAME"]

LOCK_NAME = ".lock"
_TEMP_FILE = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")


class RunDirLocked(RuntimeError):
    """The run directory is held by another live process, or cannot be written."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a process we may not signal counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_owner(path: str) -> Tuple[Optional[int], str]:
    try:
        with open(path, encoding="utf-8") as f:
            fields = f.read().split()
    except FileNotFoundError:
        return None, ""
    pid = int(fields[0]) if fields and fields[0].isdigit() else None
    return pid, fields[1] if len(fields) > 1 else ""


class RunDirLock:
    """Exclusive use of a run directory by this process (a context manager; also ``acquire``/``release``).

    Args:
        directory: the run directory (created if missing).

    Raises:
        RunDirLocked: another live process holds it, or the directory cannot be created or written.
    """

    def __init__(self, directory: str) -> None:
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, LOCK_NAME)
        self.stale_owner: Optional[int] = None
        self._held = False

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {socket.gethostname()}\n")
        return True

    def acquire(self) -> "RunDirLock":
        """Take the lock (taking over a stale one); see the class for the errors."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            for _ in range(3):
                if self._create():
                    self._held = True
                    return self
                pid, host = _read_owner(self.path)
                if pid is not None and (host not in ("", socket.gethostname()) or pid_alive(pid)):
                    raise RunDirLocked(f"run directory {self.directory} is in use by another run (pid {pid}"
                                       f"{' on ' + host if host else ''}; lock file {self.path}); wait for it to "
                                       "finish or choose another --checkname / --output-dir")
                self.stale_owner = pid
                try:
                    os.unlink(self.path)  # stale: its owner is gone
                except FileNotFoundError:
                    pass
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise RunDirLocked(f"run directory {self.directory} is not writable ({err.strerror}); choose "
                                   "another --output-dir") from None
            raise
        raise RunDirLocked(f"could not take the lock {self.path} (another run keeps creating it)")

    def release(self) -> None:
        """Remove the lock file if this process holds it."""
        if self._held:
            pid, _ = _read_owner(self.path)
            if pid == os.getpid():
                os.unlink(self.path)
            self._held = False

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def remove_stale_temp_files(directory: str) -> List[str]:
    """Delete the temporary files interrupted atomic writes left in ``directory``; returns their paths.

    Call it only while holding the directory's :class:`RunDirLock` (no write of ours can be in progress).
    """
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if _TEMP_FILE.match(name) and os.path.isfile(path):
            os.unlink(path)
            removed.append(path)
    return removed


def run_directory(output_dir: str, dataset: str, model: str, checkname: str) -> str:
    """``<output_dir>/<dataset>/<model>/<checkname>``: where a run writes its checkpoints and logs."""
    return os.path.join(output_dir, dataset, model, checkname)


def run_lock(directory: str, enabled: bool = True) -> contextlib.AbstractContextManager:
    """The run directory's :class:`RunDirLock` on the main process (rank 0 under ``torchrun``); a no-op elsewhere
    or when not ``enabled`` (a run that writes nothing, e.g. an evaluation)."""
    if not enabled or int(os.environ.get("RANK", "0")) != 0:
        return contextlib.nullcontext()
    return RunDirLock(directory)
