"""Fetching the files of a dataset: :func:`download`, :func:`extract` and the recipes' :func:`fetch_resources`.

Everything here is safe to re-run and safe to interrupt:

* :func:`download` streams into ``<dest>.part`` (resuming it when the server or file allows), verifies the checksum,
  and only then renames the file into place; a file already present with the right checksum is not fetched again.
* :func:`extract` unpacks (:func:`~.archives.unpack`: unsafe members refused) into a private staging folder next to
  the destination and moves the result into place only when the whole archive was read, never deleting anything
  already there; a marker remembers which archive (by size and modification time) was extracted,
  so a re-run does nothing.
* :func:`fetch_resources` downloads (or reuses verified copies of) a recipe's :class:`Resource` files, from their
  published URLs or from a mirror.

URLs may be ``http(s)://``, ``file://`` or a plain local path, so tests and offline mirrors use the same code path.
Checksums and atomic writes are the toolkit's own (:mod:`encoding.utils.files`).

Example:
    >>> from encoding.datasets.prepare.download import download, extract
    >>> archive = download("https://example.org/data.zip", "~/downloads",
    ...                    checksum="md5:0123456789abcdef0123456789abcdef")  # doctest: +SKIP
    >>> extract(archive, "~/.encoding/data")  # doctest: +SKIP
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import List, Mapping, NamedTuple, Optional, Sequence

from ...errors import EncodingError
from ..layout import DatasetError
from ...utils.progress import progress_bar as tqdm
from .archives import unpack

from ...utils.files import (CHUNK, ChecksumError, atomic_write, check_checksum, makedirs, parse_checksum, staged_dir,
                            verify_checksum)

__all__ = ["DownloadError", "ChecksumError", "download", "extract", "Resource", "fetch_resources"]


class DownloadError(RuntimeError, EncodingError):
    """A file could not be fetched (network failure, HTTP error, missing local file)."""


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
    for chunk in iter(lambda: src.read(CHUNK), b""):
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


def _range_total(error: urllib.error.HTTPError) -> Optional[int]:
    """The remote size a 416 answer declares (``Content-Range: bytes */<size>``), ``None`` when it declares none."""
    match = re.fullmatch(r"\s*bytes\s+\*/(\d+)\s*", (error.headers or {}).get("Content-Range") or "")
    return int(match.group(1)) if match else None


def _permanent(error: BaseException) -> bool:
    """An HTTP 4xx answer other than 408 (timeout) and 429 (too many requests): asking again will not help."""
    return isinstance(error, urllib.error.HTTPError) and 400 <= error.code < 500 and error.code not in (408, 429)


def _fetch_http(url: str, part: str, progress: bool, desc: str, timeout: float) -> None:
    done = os.path.getsize(part) if os.path.exists(part) else 0
    request = urllib.request.Request(url, headers={"User-Agent": "encoding-datasets"})
    if done:
        request.add_header("Range", f"bytes={done}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code != 416 or not done:
            raise
        if _range_total(e) == done:  # asked exactly at the end: the partial file is already complete
            return
        os.remove(part)  # a stale partial file, larger than (or not known to be) the remote one: fetch it whole
        _fetch_http(url, part, progress, desc, timeout)
        return
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
            if _permanent(e):
                raise DownloadError(f"cannot download {url}: {e}") from e
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
        retries: attempts for network errors (each attempt resumes the partial file); an HTTP 4xx answer other
            than 408 and 429 (e.g. 404) is not retried.
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
        parse_checksum(checksum)  # fail early on a malformed checksum
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


def _is_folder(path: str) -> bool:
    """A real folder (an extracted symlink to a folder is an entry of its own, moved as it is)."""
    return os.path.isdir(path) and not os.path.islink(path)


def _kind(folder: bool) -> str:
    return "folder" if folder else "file"


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_merge(src: str, dst: str, entry: str, archive: str) -> None:
    """Refuse, before anything is moved, an entry whose kind (file / folder) differs from what ``dst`` already is,
    and a file that would replace the archive itself: merging never deletes anything of the data root.

    A folder entry is merged into an existing folder, or into the folder an existing symlink points to (datasets
    kept on another disk).
    """
    if not os.path.lexists(dst):
        return
    is_folder, dst_folder = _is_folder(src), os.path.isdir(dst)
    if is_folder != dst_folder:
        raise DatasetError(archive, f"entry {entry!r} is a {_kind(is_folder)} but {dst} is an existing "
                                    f"{_kind(dst_folder)}; refusing to replace it (move it away and run again)")
    if is_folder:
        for name in sorted(os.listdir(src)):
            _check_merge(os.path.join(src, name), os.path.join(dst, name), f"{entry}/{name}", archive)
    elif _same_file(dst, archive):
        raise DatasetError(archive, f"entry {entry!r} would be written over the archive itself ({dst})")


def _merge_move(src: str, dst: str) -> None:
    """Move ``src`` to ``dst``; a folder is merged into an existing folder (or a symlink's folder), files win.

    Checked first by :func:`_check_merge`: a file never meets a folder here, and nothing is deleted.
    """
    if _is_folder(src) and os.path.isdir(dst):
        for name in os.listdir(src):
            _merge_move(os.path.join(src, name), os.path.join(dst, name))
        os.rmdir(src)
        return
    os.replace(src, dst)


def _archive_fingerprint(archive: str) -> dict:
    st = os.stat(archive)
    return {"archive": os.path.basename(archive), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _extracted_entries(marker: str, fingerprint: dict, dest: str) -> Optional[List[str]]:
    """The top-level entries the marker records for this very archive when they all still exist, else ``None``
    (no marker, an unreadable one, another archive, or an entry gone)."""
    try:
        with open(marker, encoding="utf-8") as f:
            recorded = json.load(f)
        entries = [str(e) for e in recorded["entries"]]
        same = recorded["fingerprint"] == fingerprint
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return entries if same and all(os.path.exists(os.path.join(dest, e)) for e in entries) else None


def extract(archive: str, dest: str, *, rename: Optional[Mapping[str, str]] = None, overwrite: bool = False,
            progress: bool = True) -> List[str]:
    """Unpack a zip or tar(.gz/.bz2/.xz) archive into ``dest``, all or nothing, and skip it on re-runs.

    The archive is unpacked into a staging folder inside ``dest``; only after every member was read are its top-level
    entries moved into place (folders that already exist, or symlinks to folders, are merged, e.g. two archives both
    holding ``VOCdevkit/``; an archive's file replaces a file). Members pointing outside ``dest`` are refused. A
    marker ``dest/.extracted-<archive>.json`` records the archive's size and modification time, so extracting the
    same archive again is a no-op.

    Args:
        archive: the archive file.
        dest: destination folder (created if needed).
        rename: top-level renames applied before moving into place, e.g. ``{"benchmark_RELEASE": "VOCaug"}``.
        overwrite: extract even if the marker says this archive was already extracted.
        progress: show a tqdm bar while moving entries into place.

    Returns:
        The paths of the top-level entries created or updated in ``dest``.

    Raises:
        DatasetError: not an archive, a corrupt or truncated one, an unsafe member (see
            :func:`~encoding.datasets.prepare.archives.unpack`), or an entry that is a file where ``dest`` holds a
            folder (or the other way): nothing of ``dest`` is ever deleted.
    """
    archive, dest = os.path.expanduser(archive), makedirs(dest)
    marker = os.path.join(dest, f".extracted-{os.path.basename(archive)}.json")
    fingerprint = _archive_fingerprint(archive)
    done = None if overwrite else _extracted_entries(marker, fingerprint, dest)
    if done is not None:
        return [os.path.join(dest, e) for e in done]
    rename = dict(rename or {})
    with staged_dir(os.path.join(dest, f".staging-{os.path.basename(archive)}"), keep=False) as staging:
        unpack(archive, staging)
        names = sorted(os.listdir(staging))
        for name in names:
            _check_merge(os.path.join(staging, name), os.path.join(dest, rename.get(name, name)), name, archive)
        entries = []
        for name in tqdm(names, desc=f"placing {os.path.basename(archive)}", leave=False, disable=not progress):
            target = rename.get(name, name)
            _merge_move(os.path.join(staging, name), os.path.join(dest, target))
            entries.append(target)
    atomic_write(marker, json.dumps({"fingerprint": fingerprint, "entries": entries}, indent=1,
                                    sort_keys=True))
    return [os.path.join(dest, e) for e in entries]


class Resource(NamedTuple):
    """One file to download.

    Attributes:
        url: where it is published.
        checksum: expected digest (``"md5:<hex>"``, ``"sha1:<hex>"``, ...); ``None`` when not published.
    """

    url: str
    checksum: Optional[str] = None

    @property
    def filename(self) -> str:
        return urllib.parse.unquote(os.path.basename(urllib.parse.urlparse(self.url).path))


def _mirrored(mirror: str, filename: str) -> str:
    if "://" in mirror:
        return mirror.rstrip("/") + "/" + urllib.parse.quote(filename)
    return os.path.join(os.path.expanduser(mirror), filename)


def fetch_resources(resources: Sequence[Resource], download_dir: str, *, mirror: Optional[str] = None,
                    checksums: Optional[Mapping[str, Optional[str]]] = None, overwrite: bool = False,
                    progress: bool = True) -> List[str]:
    """Download (or reuse verified copies of) ``resources`` into ``download_dir``.

    Args:
        resources: what to fetch.
        download_dir: where the archives are kept (a verified file already there is not fetched again).
        mirror: a folder or base URL holding files with the same names, used instead of the original URLs (offline
            copies, institutional mirrors, tests).
        checksums: per-file-name overrides of the expected checksums (``None`` as a value disables verification).
        overwrite: fetch again even when a verified copy exists.
        progress: show tqdm progress bars.

    Returns:
        Local paths, in the order of ``resources``.
    """
    checksums = dict(checksums or {})
    paths = []
    for res in resources:
        url = res.url if mirror is None else _mirrored(mirror, res.filename)
        checksum = checksums.get(res.filename, res.checksum)
        paths.append(download(url, os.path.join(download_dir, res.filename), checksum=checksum,
                              overwrite=overwrite, progress=progress))
    return paths
