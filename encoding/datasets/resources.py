"""Downloadable files of the real datasets, the shared fetch step of every ``prepare`` function, and the
command-line plumbing shared by ``scripts/prepare_*.py``."""
from __future__ import annotations

import argparse
import os
import sys
import urllib.parse
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence

from ..utils.files import ChecksumError, DownloadError, download

__all__ = ["Resource", "fetch_resources", "prepare_argument_parser", "checksum_overrides", "run_cli"]


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


# ------------------------------------------------------------------------------------------ command-line plumbing
def prepare_argument_parser(description: str, *, downloads: bool = True) -> argparse.ArgumentParser:
    """The options every ``scripts/prepare_*.py`` shares.

    ``--root``, ``--overwrite``, ``--no-progress``, ``--checksum NAME=DIGEST`` and, with ``downloads``,
    ``--download-dir`` and ``--mirror``.
    """
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None,
                        help="data root (default: $ENCODING_DATA or ~/.encoding/data)")
    if downloads:
        parser.add_argument("--download-dir", default=None, help="where archives are kept (default: <root>/downloads)")
        parser.add_argument("--mirror", default=None,
                            help="folder or base URL holding the archives under their original names "
                                 "(offline copies, mirrors)")
    parser.add_argument("--checksum", action="append", default=[], metavar="NAME=DIGEST",
                        help="override the expected checksum of a file, e.g. NAME=sha256:<hex> (NAME=none: skip)")
    parser.add_argument("--overwrite", action="store_true", help="download / extract / convert again")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def checksum_overrides(items: Sequence[str]) -> Dict[str, Optional[str]]:
    """Parse ``NAME=DIGEST`` options (``NAME=none`` disables verification of that file)."""
    out: Dict[str, Optional[str]] = {}
    for item in items:
        name, sep, digest = item.partition("=")
        if not sep or not name or not digest:
            raise SystemExit(f"error: --checksum expects NAME=DIGEST, got {item!r}")
        out[name] = None if digest.lower() == "none" else digest
    return out


def run_cli(step: Callable[[], Any]) -> int:
    """Run a prepare step for a script: print the result, or a one-line error and return 1."""
    from .base import DatasetError

    try:
        result = step()
    except (ChecksumError, DownloadError, DatasetError, FileNotFoundError, ImportError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for path in result if isinstance(result, (list, tuple)) else [result]:
        print(f"ready: {path}")
    return 0
