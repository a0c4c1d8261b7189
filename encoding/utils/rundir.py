"""One run per output directory: a lock the kernel holds for its process, and leftover cleanup.

:class:`FileLock` is an exclusive ``flock`` on a lock file: the kernel releases it when its holder exits in any way
(``kill -9`` included), so no pid has to be judged alive or dead -- pids mean nothing across PID namespaces
(containers sharing a folder). The generated ``shapes`` dataset and the run directory are guarded by it.

:class:`RunDirLock` holds ``<dir>/.lock`` so and writes ``pid host`` into it (for the message only). A second run
into the same directory is refused with :class:`RunDirLocked` naming the directory and the pid holding it; a lock
file left by a process that is gone (``kill -9``, power loss) holds no lock and is taken over. Taking the lock is
also the writability check of the directory: a read-only directory fails here, before any training. On a network
file system the lock is as good as the client's ``flock`` (docs/training.md, "Reliability").

:func:`die_with_parent` makes a forked worker end with the process that forked it.

:func:`run_directory` is where a run writes (``<output-dir>/<dataset>/<model>/<checkname>``); :func:`run_lock` is
the lock a run takes there: on the main process only (rank 0 under ``torchrun``).

While the lock is held, :func:`remove_stale_temp_files` deletes the temporary files of interrupted atomic writes
(``.<name>.<hex>.tmp``, see :func:`encoding.utils.files.atomic_write`, and ``.<stem>.<hex>.tmp<suffix>`` of
:func:`encoding.utils.files.atomic_path`): nobody else can be writing them.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import List, Optional, Tuple

from ..errors import EncodingError

try:
    import fcntl
except ImportError:  # Windows: no flock; the lock file is then advisory only
    fcntl = None

#: Whether :class:`FileLock` is a lock the kernel holds (``flock``); without it (Windows) it is advisory only.
KERNEL_LOCKS = fcntl is not None

__all__ = ["FileLock", "RunDirLocked", "RunDirLock", "pid_alive", "remove_stale_temp_files", "run_directory",
           "run_lock", "die_with_parent", "LOCK_NAME"]

LOCK_NAME = ".lock"
_TEMP_FILE = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp(\.[^.]*)?$")  # atomic_write; atomic_path keeps the suffix


class RunDirLocked(RuntimeError, EncodingError):
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


def _owner(text: str) -> Tuple[Optional[int], str]:
    fields = text.split()
    pid = int(fields[0]) if fields and fields[0].isdigit() else None
    return pid, fields[1] if len(fields) > 1 else ""


class FileLock:
    """An exclusive ``flock`` on ``path`` (created if missing), released by the kernel when this process dies.

    Args:
        path: the lock file; it is left in place (removing it could let two processes lock two different files),
            unless ``remove`` is given.
        blocking: wait for the lock (``acquire`` then always returns ``True``) or fail at once.
        remove: delete the lock file on release (safe: a waiter that locked the removed file retries on the new one).

    ``acquire()`` returns whether the lock was taken; the context manager raises ``BlockingIOError`` when a
    non-blocking lock is held elsewhere. ``previous`` holds what the file said when this process took it.
    """

    def __init__(self, path: str, *, blocking: bool = True, remove: bool = False) -> None:
        self.path, self.blocking, self.remove = os.fspath(path), blocking, remove
        self.fd: Optional[int] = None
        self.previous = ""

    def acquire(self) -> bool:
        while self.fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if fcntl is not None:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.blocking else fcntl.LOCK_NB))
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except (BlockingIOError, FileNotFoundError) as err:  # held elsewhere / removed by its last holder
                os.close(fd)
                if isinstance(err, BlockingIOError):
                    return False
                continue
            except BaseException:
                os.close(fd)
                raise
            if not same:  # the file we locked was removed and replaced meanwhile: lock the new one
                os.close(fd)
                continue
            self.fd = fd
            self.previous = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        return True

    def write(self, text: str) -> None:
        """Replace the lock file's content (who holds it, for the messages of others)."""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode("utf-8"), 0)

    def read(self) -> str:
        """The lock file's content (empty if it does not exist)."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def release(self) -> None:
        if self.fd is not None:
            if self.remove:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)  # while still locked: a waiter on this file sees it gone and retries
            os.close(self.fd)  # closing the descriptor releases the flock
            self.fd = None

    def __enter__(self) -> "FileLock":
        if not self.acquire():
            raise BlockingIOError(errno.EWOULDBLOCK, f"{self.path} is locked by another process", self.path)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


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
        self._lock = FileLock(self.path, blocking=False, remove=True)

    def acquire(self) -> "RunDirLock":
        """Take the lock (taking over the file of a dead run); see the class for the errors."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            if not self._lock.acquire():
                pid, host = _owner(self._lock.read())
                raise RunDirLocked(f"run directory {self.directory} is in use by another run (pid "
                                   f"{pid if pid is not None else 'unknown'}{' on ' + host if host else ''}; lock "
                                   f"file {self.path}); wait for it to finish or choose another --checkname / "
                                   "--output-dir")
            self.stale_owner = _owner(self._lock.previous)[0]  # the file of a run that died holding it
            self._lock.write(f"{os.getpid()} {socket.gethostname()}\n")
        except OSError as err:
            self._lock.release()
            if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                raise RunDirLocked(f"run directory {self.directory} is not writable ({err.strerror}); choose "
                                   "another --output-dir") from None
            raise
        return self

    def release(self) -> None:
        """Remove the lock file and release the lock if this process holds it."""
        self._lock.release()

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def die_with_parent(parent: int) -> None:
    """End this (forked worker) process when ``parent`` dies, ``kill -9`` included, so that no worker stays blocked
    on a queue holding the caller's pipes open: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux, and a thread that
    checks the parent pid (elsewhere, and as a fallback). Use it as a pool's ``initializer`` with ``os.getpid()``.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="watch-parent", daemon=True).start()


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
    """``<output_dir>/<dataset>/<model>/<checkname>``: where a run writes its checkpoints and logs (a model spec such
    as ``torchvision:deeplabv3_resnet50`` or ``transformers:PATH`` becomes one safe folder name)."""
    return os.path.join(output_dir, dataset, re.sub(r"[^\w.+-]+", "_", model).strip("_") or "model", checkname)


def run_lock(directory: str, enabled: bool = True) -> contextlib.AbstractContextManager:
    """The run directory's :class:`RunDirLock` on the main process (rank 0 under ``torchrun``); a no-op elsewhere
    or when not ``enabled`` (a run that writes nothing, e.g. an evaluation)."""
    if not enabled or int(os.environ.get("RANK", "0")) != 0:
        return contextlib.nullcontext()
    return RunDirLock(directory)
