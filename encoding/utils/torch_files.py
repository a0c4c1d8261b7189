"""What a file handed to ``torch.load`` is, before and after torch reads it: the first bytes of ``torch.save``'s
output, the records of its zip archive (from the central directory, nothing inflated), and whether a weights-only
refusal names a real object or a cut or garbled file's nothing.

``torch.save`` stores every record of its zip archive uncompressed, so the records of a genuine file fit in the file.
A compressed record, or records declaring more bytes than the file holds (several entries sharing one body), can
only make ``torch.load`` allocate far more memory than the file's size: such a file is refused before it is read.
"""
from __future__ import annotations

import os
import re
import struct
import sys
import zipfile
from typing import Optional

__all__ = ["looks_like_torch_file", "zip_records_problem", "torch_file_problem", "global_naming_nothing"]

_ZIP_MAGIC = b"PK\x03\x04"  # a local file header: torch.save's zip archives start with one
_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL (\S*)")


def looks_like_torch_file(path: str) -> bool:
    """Whether the file starts like ``torch.save`` output: a zip archive or a pickle (protocol >= 2)."""
    with open(path, "rb") as f:
        head = f.read(4)
    return head.startswith(_ZIP_MAGIC) or head[:1] == b"\x80"


def zip_records_problem(path: str) -> Optional[str]:
    """Why the zip archive ``path`` cannot be a ``torch.save`` file that loads within its size (a predicate to
    follow the file's name: ``"is refused unread: ..."``), or ``None``.

    Only the central directory is read: a compressed record, or records declaring more bytes in all than the file
    holds, is reported without inflating anything.
    """
    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, struct.error) as err:
        detail = str(err).splitlines()[0] if str(err) else ""
        return f"cannot be read: the file is truncated or corrupt ({type(err).__name__}: {detail})"
    compressed = next((r for r in records if r.compress_type != zipfile.ZIP_STORED), None)
    if compressed is not None:
        return (f"is refused unread: record {compressed.filename!r} is compressed, which torch.save never writes "
                f"(torch.load would inflate its {compressed.file_size:,} bytes)")
    declared = sum(r.file_size for r in records)
    if declared > size:
        return (f"is refused unread: its records declare {declared:,} bytes in all, more than the file's {size:,} "
                "(torch.save writes them uncompressed, so they fit in the file)")
    return None


def torch_file_problem(path: str) -> Optional[str]:
    """Why the file ``path`` is refused before ``torch.load`` reads it (not ``torch.save`` output, or a zip archive
    that would load into more memory than its size, see :func:`zip_records_problem`), or ``None``."""
    if os.path.getsize(path) == 0:
        return None  # torch.load reports it (an empty file is a truncated one)
    if not looks_like_torch_file(path):
        return "is not a checkpoint: it is not a file written by torch.save"
    with open(path, "rb") as f:
        is_zip = f.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC
    return zip_records_problem(path) if is_zip else None  # a legacy (pickle) file stores its tensors unpacked


def global_naming_nothing(message: str) -> Optional[str]:
    """The global a weights-only refusal (``message``) names, if it names nothing: no dotted Python name (``"."``,
    the ``GLOBAL`` line of a file cut in the middle), or a name missing from a module already imported
    (``collections.Ord``). ``None`` where it may be a real object: nothing is imported to find out."""
    match = _REFUSED_GLOBAL.search(message)
    if match is None:
        return None
    dotted = match.group(1)
    module, _, name = dotted.rpartition(".")
    if not (name.isidentifier() and all(part.isidentifier() for part in module.split("."))):
        return dotted
    loaded = sys.modules.get(module)
    return dotted if loaded is not None and not hasattr(loaded, name) else None
