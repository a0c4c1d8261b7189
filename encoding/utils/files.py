"""Download, verify and extract helpers shared by the dataset prepare scripts and the embedded ``shapes`` generator.

Everything here is safe to re-run and safe to interrupt:

* :func:`download` streams into ``<dest>.part`` (resuming it when the server or file allows), verifies the checksum,
  and only then renames the file into place; a file already present with the right checksum is not fetched again.
* :func:`extract` unpacks into a private staging folder next to the destination and moves the result into place only
  when the whole archive was read; a marker remembers which archive (by size and checksum) was extracted, so a re-run
  does nothing.
* :func:`atomic_write` writes one file all or nothing (temporary file in the same folder, fsync, rename): the one
  home of atomic file writes (checkpoints, split lists, markers).
* :func:`staged_dir` is the same all-or-nothing pattern for anything a program writes itself (generated datasets,
  converted masks): build in a temporary folder, rename at the end.

URLs may be ``http(s)://``, ``file://`` or a plain local path, so tests and offline mirrors use the same code path.
PyTorch-Encoding's ``mkdir`` and ``check_sha1`` are implemented in :mod:`encoding.compat` and importable from here.

Example:
    >>> from encoding.utils.files import download, extract
    >>> archive = download("https://example.org/data.zip", "~/downloads",
    ...                    checksum="md5:0123456789abcdef0123456789abcdef")  # doctest: +SKIP
    >>> extract(archive, "~/.encoding/data")  # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
import zipfile
import zlib
from typing import Iterator, List, Mapping, Optional, Tuple, Union

from tqdm.auto import tqdm

from .rundir import pid_alive

__all__ = [
    "DownloadError",
    "ChecksumError",
    "file_checksum",
    "check_checksum",
    "verify_checksum",
    "download",
    "extract",
    "staged_dir",
    "atomic_write",
    "makedirs",
    "mkdir",
    "check_sha1",
]

_CHUNK = 1 << 20
_ALGORITHMS_BY_LENGTH = {32: "md5", 40: "sha1", 64: "sha256"}


class DownloadError(RuntimeError):
    """A file could not be fetched (network failure, HTTP error, missing local file)."""


class ChecksumError(RuntimeError):
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


def _parse_checksum(checksum: str) -> Tuple[str, str]:
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
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def check_checksum(path: str, checksum: Optional[str], progress: bool = False) -> bool:
    """Whether ``path`` exists and matches ``checksum`` (``None`` accepts any existing file)."""
    if not os.path.isfile(path):
        return False
    if checksum is None:
        return True
    algo, digest = _parse_checksum(checksum)
    return file_checksum(path, algo, progress) == digest


def verify_checksum(path: str, checksum: str, progress: bool = False) -> None:
    """Raise :class:`ChecksumError` unless ``path`` matches ``checksum`` (see :func:`download` for the format)."""
    algo, digest = _parse_checksum(checksum)
    actual = file_checksum(path, algo, progress)
    if actual != digest:
        raise ChecksumError(path, checksum, f"{algo}:{actual}")


def _local_source(url: str) -> Optional[str]:
    """The local path behind a ``file://`` URL or a plain path; ``None`` for network URLs."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return urllib.request.url2pathname(parsed.path)
    if parsed.scheme in ("http", "https", "ftp"):
        return None
    return os.path.expanduser(url)


def _url_filename(url: str) -> str:
    name = os.path.basename(urllib.parse.urlparse(url).path) if "://" in url else os.path.basename(url)
    if not name:
        raise ValueError(f"cannot derive a file name from {url!r}; pass an explicit file path as `path`")
    return urllib.parse.unquote(name)


def _copy_stream(src, dst, bar) -> None:
    for chunk in iter(lambda: src.read(_CHUNK), b""):
        dst.write(chunk)
        bar.update(len(chunk))


def _fetch_local(source: str, part: str, progress: bool, desc: str) -> None:
    if not os.path.isfile(source):
        raise DownloadError(f"cannot download {source}: no such file")
    total = os.path.getsize(source)
    done = os.path.getsize(part) if os.path.exists(part) else 0
    if done > total:  # stale partial file from another source
        done = 0
    with open(source, "rb") as src, open(part, "ab" if done else "wb") as dst, \
            tqdm(total=total, initial=done, unit="B", unit_scale=True, desc=desc, disable=not progress) as bar:
        src.seek(done)
        _copy_stream(src, dst, bar)


def _fetch_http(url: str, part: str, progress: bool, desc: str, timeout: float) -> None:
    done = os.path.getsize(part) if os.path.exists(part) else 0
    request = urllib.request.Request(url, headers={"User-Agent": "encoding-datasets"})
    if done:
        request.add_header("Range", f"bytes={done}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and done:  # asked past the end: the partial file is already complete
            return
        raise
    with response:
        resumed = done and response.status == 206
        if not resumed:
            done = 0
        length = response.headers.get("Content-Length")
        total = int(length) + done if length is not None else None
        with open(part, "ab" if resumed else "wb") as dst, \
                tqdm(total=total, initial=done, unit="B", unit_scale=True, desc=desc, disable=not progress) as bar:
            _copy_stream(response, dst, bar)
        if total is not None and os.path.getsize(part) != total:
            raise DownloadError(f"download of {url} stopped at {os.path.getsize(part)} of {total} bytes")


def _fetch_http_with_retries(url: str, part: str, progress: bool, desc: str, timeout: float, retries: int) -> None:
    for attempt in range(1, max(retries, 1) + 1):
        try:
            _fetch_http(url, part, progress, desc, timeout)
            return
        except (urllib.error.URLError, OSError, DownloadError) as e:  # HTTPError is a URLError
            if attempt >= retries:
                raise DownloadError(f"cannot download {url} after {attempt} attempt(s): {e}") from e
            time.sleep(min(2 ** attempt, 30))


def download(url: str, path: Optional[str] = None, overwrite: bool = False, sha1_hash: Optional[str] = None, *,
             checksum: Optional[str] = None, progress: bool = True, retries: int = 3, timeout: float = 60.0) -> str:
    """Fetch ``url`` into ``path`` with a progress bar, resuming, checksum verification and an atomic rename.

    Args:
        url: ``http(s)://`` or ``file://`` URL, or a local file path.
        path: destination file, or an existing folder (the URL's file name is kept); default: the current folder.
        overwrite: fetch again even if a verified file is already there.
        sha1_hash: PyTorch-Encoding's argument, same as ``checksum="sha1:<hash>"``.
        checksum: expected digest, ``"md5:<hex>"``, ``"sha1:<hex>"``, ``"sha256:<hex>"`` or bare hex (algorithm from
            its length). ``None`` skips verification.
        progress: show a tqdm progress bar.
        retries: attempts for network errors (each attempt resumes the partial file).
        timeout: socket timeout in seconds.

    Returns:
        The path of the verified file.

    Raises:
        ChecksumError: the downloaded content does not match ``checksum`` (the bad file is deleted, nothing is left
            at ``path``).
        DownloadError: the source cannot be read after ``retries`` attempts.
    """
    if sha1_hash is not None:
        if checksum is not None:
            raise ValueError("pass either checksum or sha1_hash, not both")
        checksum = "sha1:" + sha1_hash
    if checksum is not None:
        _parse_checksum(checksum)  # fail early on a malformed checksum
    if path is None:
        path = _url_filename(url)
    path = os.path.expanduser(path)
    if os.path.isdir(path):
        path = os.path.join(path, _url_filename(url))
    makedirs(os.path.dirname(os.path.abspath(path)))
    if not overwrite and check_checksum(path, checksum):
        return path

    part = path + ".part"
    if overwrite and os.path.exists(part):
        os.remove(part)
    source = _local_source(url)
    desc = os.path.basename(path)
    if source is not None:
        _fetch_local(source, part, progress, desc)
    else:
        _fetch_http_with_retries(url, part, progress, desc, timeout, retries)

    if checksum is not None:
        try:
            verify_checksum(part, checksum, progress)
        except ChecksumError as e:
            os.remove(part)
            raise ChecksumError(f"{path} (from {url})", checksum, e.actual) from None
    os.replace(part, path)
    return path


def _archive_kind(archive: str) -> str:
    if zipfile.is_zipfile(archive):
        return "zip"
    if tarfile.is_tarfile(archive):
        return "tar"
    raise ValueError(f"{archive}: not a zip or tar archive (or it is corrupt)")


def _check_member(name: str, archive: str) -> None:
    normalised = os.path.normpath(name)
    if os.path.isabs(name) or normalised == ".." or normalised.startswith(".." + os.sep):
        raise ValueError(f"{archive}: refusing to extract {name!r}, which points outside the destination")


def _extract_all(archive: str, kind: str, dest: str) -> None:
    if kind == "zip":
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                _check_member(name, archive)
            zf.extractall(dest)
        return
    with tarfile.open(archive) as tf:
        members = tf.getmembers()
        for member in members:
            _check_member(member.name, archive)
            if member.issym() or member.islnk():
                _check_member(os.path.join(os.path.dirname(member.name), member.linkname), archive)
        if hasattr(tarfile, "data_filter"):
            tf.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Python < 3.11.4
            tf.extractall(dest, members=members)


def _merge_move(src: str, dst: str) -> None:
    """Move ``src`` to ``dst``; when both are folders, merge ``src`` into ``dst`` (its files win)."""
    if os.path.isdir(src) and os.path.isdir(dst) and not os.path.islink(dst):
        for name in os.listdir(src):
            _merge_move(os.path.join(src, name), os.path.join(dst, name))
        os.rmdir(src)
        return
    if os.path.isdir(dst) and not os.path.islink(dst):
        shutil.rmtree(dst)
    os.replace(src, dst)


def _archive_fingerprint(archive: str) -> dict:
    st = os.stat(archive)
    return {"archive": os.path.basename(archive), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def extract(archive: str, dest: str, *, rename: Optional[Mapping[str, str]] = None, overwrite: bool = False,
            progress: bool = True) -> List[str]:
    """Unpack a zip or tar(.gz/.bz2/.xz) archive into ``dest``, all or nothing, and skip it on re-runs.

    The archive is unpacked into a staging folder inside ``dest``; only after every member was read are its top-level
    entries moved into place (folders that already exist are merged, e.g. two archives both holding ``VOCdevkit/``).
    Members pointing outside ``dest`` are refused. A marker ``dest/.extracted-<archive>.json`` records the archive's
    size and modification time, so extracting the same archive again is a no-op.

    Args:
        archive: the archive file.
        dest: destination folder (created if needed).
        rename: top-level renames applied before moving into place, e.g. ``{"benchmark_RELEASE": "VOCaug"}``.
        overwrite: extract even if the marker says this archive was already extracted.
        progress: show a tqdm bar while moving entries into place.

    Returns:
        The paths of the top-level entries created or updated in ``dest``.

    Raises:
        ValueError: not an archive, a corrupt archive, or an unsafe member path.
    """
    archive, dest = os.path.expanduser(archive), makedirs(dest)
    marker = os.path.join(dest, f".extracted-{os.path.basename(archive)}.json")
    fingerprint = _archive_fingerprint(archive)
    if not overwrite and os.path.isfile(marker):
        with open(marker, encoding="utf-8") as f:
            recorded = json.load(f)
        if recorded.get("fingerprint") == fingerprint and all(
                os.path.exists(os.path.join(dest, e)) for e in recorded.get("entries", [])):
            return [os.path.join(dest, e) for e in recorded["entries"]]
    kind = _archive_kind(archive)
    rename = dict(rename or {})
    with staged_dir(os.path.join(dest, f".staging-{os.path.basename(archive)}"), keep=False) as staging:
        try:
            _extract_all(archive, kind, staging)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise ValueError(f"{archive}: corrupt or truncated archive ({e})") from e
        entries = []
        names = sorted(os.listdir(staging))
        for name in tqdm(names, desc=f"placing {os.path.basename(archive)}", leave=False, disable=not progress):
            target = rename.get(name, name)
            _merge_move(os.path.join(staging, name), os.path.join(dest, target))
            entries.append(target)
    _write_json_atomic(marker, {"fingerprint": fingerprint, "entries": entries})
    return [os.path.join(dest, e) for e in entries]


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


def _write_json_atomic(path: str, payload: dict) -> None:
    atomic_write(path, json.dumps(payload, indent=1, sort_keys=True))


def _remove_tree(path: str) -> None:
    def _onerror(func, p, _exc):  # read-only files (e.g. from archives) block rmtree on some systems
        os.chmod(p, stat.S_IWRITE)
        func(p)

    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, onerror=_onerror)
    elif os.path.lexists(path):
        os.remove(path)


def _remove_stale_staging(parent: str, prefix: str) -> None:
    """Delete staging folders ``<prefix><pid>-*`` whose process no longer exists (killed mid-build)."""
    for name in os.listdir(parent):
        pid = name[len(prefix):].split("-", 1)[0] if name.startswith(prefix) else ""
        if pid.isdigit() and not pid_alive(int(pid)):
            _remove_tree(os.path.join(parent, name))


@contextlib.contextmanager
def staged_dir(final: str, *, keep: bool = True, replace: bool = False) -> Iterator[str]:
    """Build a folder under a temporary name and move it to ``final`` only if the block succeeds.

    Args:
        final: where the finished folder should end up (its parent is created).
        keep: ``True`` renames the staging folder to ``final`` on success. ``False`` only guarantees cleanup (the
            caller moves the contents itself, as :func:`extract` does).
        replace: when ``final`` already exists, swap it out for the new folder (the old one is deleted). Without it,
            an existing ``final`` is kept and the new folder discarded (another process finished first).

    Yields:
        The path of the empty staging folder (on the same file system as ``final``, so the rename is atomic). Its
        name carries this process's pid; staging folders of processes that no longer exist (killed mid-build) are
        deleted when the next one starts.
    """
    final = os.path.abspath(os.path.expanduser(final))
    parent = makedirs(os.path.dirname(final))
    prefix = f".{os.path.basename(final)}.tmp-"
    _remove_stale_staging(parent, prefix)
    staging = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)
    try:
        yield staging
        if keep:
            if os.path.exists(final) and replace:
                trash = f"{final}.old-{uuid.uuid4().hex}"
                os.replace(final, trash)
                os.replace(staging, final)
                _remove_tree(trash)
            elif not os.path.exists(final):
                try:
                    os.replace(staging, final)
                except OSError:
                    if not os.path.exists(final):  # not a lost race: a real failure
                        raise
    finally:
        _remove_tree(staging)


def __getattr__(name: str) -> object:
    """PyTorch-Encoding's ``mkdir`` / ``check_sha1``, implemented in :mod:`encoding.compat`."""
    from .. import compat

    return compat.export(__name__, name)
