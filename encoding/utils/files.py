"""File helpers of the whole toolkit: atomic writes, staged folders, checksums.

Everything here is safe to re-run and safe to interrupt:

* :func:`atomic_write` writes one file all or nothing (temporary file in the same folder, fsync, rename): the one
  home of atomic file writes (checkpoints, split lists, markers).
* :func:`staged_dir` is the same all-or-nothing pattern for anything a program writes itself (generated datasets,
  converted masks, extracted archives): build in a temporary folder, rename at the end.
* :func:`file_checksum`, :func:`check_checksum` and :func:`verify_checksum` hash files in chunks
  (``"md5:<hex>"``, ``"sha1:<hex>"``, ``"sha256:<hex>"`` or bare hex, see :func:`parse_checksum`).

Downloading and extracting archives is a dataset-preparation step: :mod:`encoding.datasets.prepare.download`.
PyTorch-Encoding's ``mkdir`` and ``check_sha1`` (on :func:`makedirs` and :func:`check_checksum`) are declared for this
module in ``encoding/legacy/helpers.py``, ``download`` in ``encoding/legacy/aliases.py``.

Example:
    >>> import os, tempfile
    >>> from encoding.utils.files import atomic_write, check_checksum
    >>> path = atomic_write(os.path.join(tempfile.mkdtemp(), "ids.txt"), "2008_000001")
    >>> check_checksum(path, "md5:" + "0" * 32)
    False
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import uuid
from typing import Iterator, List, Optional, Sequence, Tuple, Union

from ..errors import EncodingError, UsageError
from .progress import progress_bar as tqdm

from .rundir import KERNEL_LOCKS, FileLock, pid_alive

__all__ = [
    "ChecksumError",
    "parse_checksum",
    "file_checksum",
    "check_checksum",
    "verify_checksum",
    "staged_dir",
    "atomic_write",
    "atomic_path",
    "refuse_own_input",
    "source_files",
    "makedirs",
    "user_cache_file",
]


#: Bytes read at a time when hashing or copying files.
CHUNK = 1 << 20
_ALGORITHMS_BY_LENGTH = {32: "md5", 40: "sha1", 64: "sha256"}


class ChecksumError(RuntimeError, EncodingError):
    """A file's checksum differs from the expected one.

    Attributes:
        path: the offending file (already removed when it was a fresh download).
        expected: the expected checksum as given (``"algo:hex"`` or bare hex).
        actual: the checksum computed, with the same algorithm.
    """

    def __init__(self, path: str, expected: str, actual: str) -> None:
        super().__init__(f"checksum mismatch for {path}: expected {expected}, got {actual}")
        self.path, self.expected, self.actual = path, expected, actual


def makedirs(path: str) -> str:
    """Create ``path`` (and parents) if needed and return it with ``~`` expanded."""
    path = os.path.expanduser(path)
    os.makedirs(path, exist_ok=True)
    return path


def parse_checksum(checksum: str) -> Tuple[str, str]:
    """Split ``"algo:hex"`` (or bare hex, algorithm inferred from its length) into ``(algo, hex)``."""
    if ":" in checksum:
        algo, digest = checksum.split(":", 1)
        algo = algo.lower()
    else:
        digest = checksum
        algo = _ALGORITHMS_BY_LENGTH.get(len(checksum), "")
    digest = digest.strip().lower()
    if algo not in hashlib.algorithms_available or not digest:
        raise ValueError(f"cannot tell the hash algorithm of checksum {checksum!r}; write it as 'md5:<hex>', "
                         f"'sha1:<hex>' or 'sha256:<hex>'")
    return algo, digest


def file_checksum(path: str, algo: str = "sha256", progress: bool = False) -> str:
    """Hex digest of a file, read in chunks.

    Args:
        path: the file.
        algo: any :mod:`hashlib` algorithm name.
        progress: show a tqdm bar (useful for multi-GB archives).
    """
    h = hashlib.new(algo)
    with open(path, "rb") as f, tqdm(total=os.path.getsize(path), unit="B", unit_scale=True, leave=False,
                                     desc=f"{algo} {os.path.basename(path)}", disable=not progress) as bar:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def check_checksum(path: str, checksum: Optional[str], progress: bool = False) -> bool:
    """Whether ``path`` exists and matches ``checksum`` (``None`` accepts any existing file)."""
    if not os.path.isfile(path):
        return False
    if checksum is None:
        return True
    algo, digest = parse_checksum(checksum)
    return file_checksum(path, algo, progress) == digest


def verify_checksum(path: str, checksum: str, progress: bool = False) -> None:
    """Raise :class:`ChecksumError` unless ``path`` matches ``checksum`` (format: see :func:`parse_checksum`)."""
    algo, digest = parse_checksum(checksum)
    actual = file_checksum(path, algo, progress)
    if actual != digest:
        raise ChecksumError(path, checksum, f"{algo}:{actual}")


def _fsync_dir(directory: str) -> None:
    """Persist a rename itself (POSIX); silently skipped where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, data: Union[bytes, str]) -> str:
    """Write ``data`` to ``path`` all or nothing: a crash leaves the old file or the new one, never a partial one.

    The data goes to a temporary file in the same folder (created with the usual permissions), is flushed and
    fsynced, then renamed over ``path``; the temporary file is removed if anything fails.

    Args:
        path: the destination file (its folder must exist).
        data: bytes, or text (written as UTF-8).

    Returns:
        ``path``.

    Raises:
        OSError: the write failed (disk full, no permission, ...); the message names ``path``.
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "xb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno is not None:  # e.g. ENOSPC: say which file could not be written
            raise type(err)(err.errno, f"cannot write {path}: {err.strerror}", path) from None
        raise
    _fsync_dir(directory)
    return path


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """For writers that take a file name (``torch.export.save``, ``onnx.save``, ``savefig``): yields a temporary path
    in ``path``'s folder; when the block succeeds the file there is fsynced and renamed over ``path``, otherwise it is
    removed (``path`` keeps its old content). The folder is created.

    Raises:
        OSError: the folder cannot be made or the file not renamed (the message names ``path``).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    stem, suffix = os.path.splitext(os.path.basename(path))  # the suffix kept last: writers check it (.pt2)
    tmp = os.path.join(directory, f".{stem}.{uuid.uuid4().hex}.tmp{suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno is not None:
            raise type(err)(err.errno, f"cannot write {path}: {err.strerror}", path) from None
        raise
    _fsync_dir(directory)


def _identity(path: str) -> Optional[Tuple[int, int]]:
    """``(device, inode)`` of an existing file (hard links to one file share it), else ``None``."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def refuse_own_input(outputs: Union[str, Sequence[Union[str, Tuple[str, str]]]],
                     inputs: Union[str, Sequence[Optional[str]]], option: str = "output") -> None:
    """Refuse to write over a file the same command reads, or twice to one file.

    Args:
        outputs: the file(s) a command is about to write, each a path or an ``(option, path)`` pair naming the
            option that chose it.
        inputs: the file(s) it reads (``None`` entries are ignored).
        option: how to name the outputs given as plain paths in the message (e.g. ``"--output"``).

    Raises:
        UsageError: one line naming the option and path: an output is an input, a directory, or two outputs are
            one file (a ``ValueError``: a script ends in that line, exit status 2).
    """
    outputs = [outputs] if isinstance(outputs, (str, os.PathLike)) else list(outputs)
    named = [out if isinstance(out, tuple) else (option, out) for out in outputs]
    inputs = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    read = {os.path.realpath(os.fspath(p)): os.fspath(p) for p in inputs if p is not None}
    identities = {_identity(p): p for p in read.values() if _identity(p) is not None}
    written: dict = {}
    for name, out in ((name, os.fspath(out)) for name, out in named):
        if os.path.isdir(out):
            raise UsageError(f"{name} {out}: is a directory; give a file path")
        real, identity = os.path.realpath(out), _identity(out)
        source = read.get(real) or (identities.get(identity) if identity is not None else None)
        if source is not None:
            raise UsageError(f"{name} {out}: that is the input file {source}; writing it would destroy it "
                             "(give another path)")
        if real in written:
            raise UsageError(f"{name} {out}: the same file as {written[real]}, both written; give another path")
        written[real] = f"{name} {out}"


def source_files(source: str) -> List[str]:
    """The files a command reading ``source`` reads: the file itself, or every file of a folder (a model folder's
    config.json and weights); ``[]`` when nothing is there. What :func:`refuse_own_input` is given as inputs."""
    if os.path.isdir(source):
        return [os.path.join(source, name) for name in sorted(os.listdir(source))
                if os.path.isfile(os.path.join(source, name))]
    return [source] if os.path.exists(source) else []


def _remove_tree(path: str) -> None:
    def _onerror(func, p, _exc):  # read-only files (e.g. from archives) block rmtree on some systems
        os.chmod(p, stat.S_IWRITE)
        func(p)

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, onerror=_onerror)
    elif os.path.lexists(path):
        os.remove(path)


def _staging_lock(staging: str) -> str:
    return staging + ".lock"


def _remove_stale_staging(parent: str, prefix: str) -> None:
    """Delete the staging folders ``<prefix>*`` of builds that ended without finishing (killed mid-build).

    A build holds an exclusive ``flock`` on ``<staging>.lock`` from before its folder exists until after it is gone,
    so a folder whose lock can be taken has no live builder: the kernel released it when that process died, in any
    way and in any PID namespace (no pid is judged). A folder without a lock file is an earlier release's
    ``<prefix><pid>-*``, judged by its pid as that release did.
    """
    for name in sorted(os.listdir(parent)):
        path = os.path.join(parent, name)
        if not name.startswith(prefix) or not os.path.lexists(path):  # not ours, or removed with its pair
            continue
        folder = path[:-len(".lock")] if name.endswith(".lock") else path
        if name.endswith(".lock") or os.path.exists(_staging_lock(folder)):
            if not KERNEL_LOCKS:  # no flock (Windows): whether its builder lives cannot be told; left in place
                continue
            lock = FileLock(_staging_lock(folder), blocking=False, remove=True)
            if os.path.exists(lock.path) and lock.acquire():
                try:
                    _remove_tree(folder)
                finally:
                    lock.release()
            continue
        pid, dash, _ = name[len(prefix):].partition("-")
        if dash and pid.isdigit() and not pid_alive(int(pid)):
            _remove_tree(path)


def _swap_in(staging: str, final: str, replace: bool) -> None:
    """Move the finished ``staging`` folder to ``final``, under a lock so that concurrent builds do not interleave:
    an existing ``final`` is kept (``replace=False``: another build finished first) or swapped out and deleted, and
    put back when the new folder cannot be moved in."""
    with FileLock(os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.swap.lock"), remove=True):
        if not os.path.exists(final):
            os.replace(staging, final)
        elif replace:
            trash = f"{final}.old-{uuid.uuid4().hex}"
            os.replace(final, trash)
            try:
                os.replace(staging, final)
            except BaseException:
                os.replace(trash, final)  # the old folder back where it was: nothing lost
                raise
            _remove_tree(trash)


@contextlib.contextmanager
def staged_dir(final: str, *, keep: bool = True, replace: bool = False) -> Iterator[str]:
    """Build a folder under a temporary name and move it to ``final`` only if the block succeeds.

    Args:
        final: where the finished folder should end up (its parent is created).
        keep: ``True`` renames the staging folder to ``final`` on success. ``False`` only guarantees cleanup (the
            caller moves the contents itself, as :func:`~encoding.datasets.prepare.download.extract` does).
        replace: when ``final`` already exists, swap it out for the new folder (the old one is deleted once the new
            one is in place, and put back if it cannot be). Without it, an existing ``final`` is kept and the new
            folder discarded (another process finished first).

    Yields:
        The path of the empty staging folder (on the same file system as ``final``, so the rename is atomic). This
        process holds a ``flock`` on ``<staging>.lock`` while it builds; the staging folders of builds that no longer
        hold theirs (killed mid-build, in any PID namespace) are deleted when the next one starts.
    """
    final = os.path.abspath(os.path.expanduser(final))
    parent = makedirs(os.path.dirname(final))
    prefix = f".{os.path.basename(final)}.tmp-"
    _remove_stale_staging(parent, prefix)
    staging = os.path.join(parent, f"{prefix}{uuid.uuid4().hex}")
    lock = FileLock(_staging_lock(staging), blocking=False, remove=True)
    if not lock.acquire():  # a fresh random name: nobody else can hold it
        raise RuntimeError(f"staging lock {lock.path} is held by another process")
    try:
        os.mkdir(staging)
        try:
            yield staging
            if keep:
                _swap_in(staging, final, replace)
        finally:
            _remove_tree(staging)
    finally:
        lock.release()


def user_cache_file(kind: str, folder: str) -> str:
    """Where a cache of ``kind`` (``"scans"``, ``"label_counts"``) about the data ``folder`` lives: a file of the
    user's cache folder named after the folder's absolute path (``$XDG_CACHE_HOME/encoding/<kind>/<hash>.json``,
    default ``~/.cache/encoding/...``), never in the data's folder (a user's, which may be read-only)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(os.path.abspath(folder).encode("utf-8", "surrogateescape")).hexdigest()[:20]
    return os.path.join(base, "encoding", kind, digest + ".json")
