"""Downloadable files of the real datasets and the shared fetch step of every ``prepare_<name>`` function (the
command line is :mod:`encoding.datasets.prepare`)."""
from __future__ import annotations

import os
import urllib.parse
from typing import List, Mapping, NamedTuple, Optional, Sequence

from ..utils.files import download

__all__ = ["Resource", "fetch_resources"]


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
