"""Reading a zip or tar archive into a staging folder, refusing every member that could write outside it.

:func:`unpack` is the reading half of :func:`~encoding.datasets.prepare.download.extract` (which then moves the
staged entries into place). Every member name is checked lexically (no absolute path, no ``..`` above the
destination). Tar archives are also read through the standard library's ``data`` filter where the Python has it
(3.9.17, 3.10.12, 3.11.4 and later): links that resolve outside, device files and FIFOs are refused. A Python
without the filter cannot follow what a chain of symlinks resolves to, so there every symlink, hard link, device and
FIFO member is refused. A corrupt or truncated archive and an unsafe member are each one
:class:`~encoding.datasets.layout.DatasetError` naming the archive.
"""
from __future__ import annotations

import gzip
import lzma
import os
import tarfile
import zipfile
import zlib

from ..layout import DatasetError

__all__ = ["archive_kind", "unpack"]

#: What the standard library raises for a corrupt or truncated archive (or one using an unsupported compression).
_CORRUPT = (zipfile.BadZipFile, zipfile.LargeZipFile, tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile,
            lzma.LZMAError, NotImplementedError)
#: What the tar ``data`` filter raises for a member it refuses (nothing on a Python without the filter).
_FILTER_ERROR = getattr(tarfile, "FilterError", ())


def archive_kind(archive: str) -> str:
    """``"zip"`` or ``"tar"`` (any compression), from the content of ``archive``.

    Raises:
        DatasetError: neither (or too corrupt to tell).
    """
    if zipfile.is_zipfile(archive):
        return "zip"
    if tarfile.is_tarfile(archive):
        return "tar"
    raise DatasetError(archive, "not a zip or tar archive (or it is corrupt)")


def _check_name(member: str, target: str, archive: str) -> None:
    """Refuse ``member`` when ``target`` (its name, or where its link points) is absolute or climbs out."""
    normalised = os.path.normpath(target)
    if os.path.isabs(target) or normalised == ".." or normalised.startswith(".." + os.sep):
        raise DatasetError(archive, f"unsafe member {member!r} ({target!r} points outside the destination)")


def _special_kind(member: tarfile.TarInfo) -> str:
    """What a tar member is when it is neither a regular file nor a folder (``""`` when it is one of those)."""
    if member.isfile() or member.isdir():
        return ""
    kinds = ((member.issym(), "a symlink"), (member.islnk(), "a hard link"), (member.ischr(), "a character device"),
             (member.isblk(), "a block device"), (member.isfifo(), "a FIFO"))
    return next((kind for found, kind in kinds if found), "a special file")


def _check_unfiltered(member: tarfile.TarInfo, archive: str) -> None:
    """Without the ``data`` filter only regular files and folders are extracted (a chain of symlinks escapes a
    check of the names alone)."""
    kind = _special_kind(member)
    if kind:
        raise DatasetError(archive, f"unsafe member {member.name!r} ({kind}; this Python's tarfile has no "
                                    "extraction filter, so links and special files are refused: use Python "
                                    ">= 3.9.17, 3.10.12 or 3.11.4 to extract it)")


def _unpack_zip(archive: str, dest: str) -> None:
    with zipfile.ZipFile(archive) as zf:
        for name in zf.namelist():
            _check_name(name, name, archive)
        zf.extractall(dest)


def _unpack_tar(archive: str, dest: str) -> None:
    filtered = hasattr(tarfile, "data_filter")
    with tarfile.open(archive) as tf:
        members = tf.getmembers()
        for member in members:
            _check_name(member.name, member.name, archive)
            if member.issym() or member.islnk():
                _check_name(member.name, os.path.join(os.path.dirname(member.name), member.linkname), archive)
            if not filtered:
                _check_unfiltered(member, archive)
        if filtered:
            tf.extractall(dest, members=members, filter="data")
        else:
            tf.extractall(dest, members=members)


def unpack(archive: str, dest: str) -> None:
    """Extract every member of the zip or tar ``archive`` into the (staging) folder ``dest``.

    Raises:
        DatasetError: not an archive, a corrupt or truncated one, or an unsafe member (``unsafe member 'name'
            (why)``); what was written into ``dest`` is the caller's to discard.
    """
    kind = archive_kind(archive)
    try:
        (_unpack_zip if kind == "zip" else _unpack_tar)(archive, dest)
    except _FILTER_ERROR as e:
        raise DatasetError(archive, f"unsafe member {e.tarinfo.name!r} ({e})") from e
    except _CORRUPT as e:
        raise DatasetError(archive, f"corrupt or truncated archive ({e})") from e
