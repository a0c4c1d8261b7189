"""The header of a shared model's ``model.safetensors``, read and checked without reading the weights: what
:func:`~encoding.inference.hub.load_pretrained` compares with the network's ``meta`` twin before anything is built.
"""
from __future__ import annotations

import json
import math
import os
from typing import Dict

import torch

from ..errors import UsageError

__all__ = ["MAX_HEADER_BYTES", "bad_folder", "read_safetensors_header", "file_size", "read_bytes"]

#: The largest safetensors header read (safetensors' own header limit is 100 MB).
MAX_HEADER_BYTES = 100 << 20
#: safetensors' dtype names -> torch's.
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def bad_folder(folder: str, what: str) -> UsageError:
    """The one-line refusal of a shared model ``folder`` (``what`` is wrong with it)."""
    return UsageError(f"{folder}: not a usable shared encoding model: {what}")


def read_safetensors_header(path: str, folder: str) -> Dict[str, torch.Tensor]:
    """The tensors a safetensors file holds, as ``meta`` tensors of their dtype and shape, from its header alone
    (at most :data:`MAX_HEADER_BYTES` read; every entry's byte range checked against the file's size, and the file's
    size against ``8 + header length + the largest data_offsets end``).

    Raises:
        UsageError: a missing, truncated or damaged file, a header too large, an unknown dtype, bytes after the
            data (naming ``folder``).
    """
    name = os.path.basename(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little") if size >= 8 else -1
            raw = f.read(length) if 0 < length <= min(MAX_HEADER_BYTES, size - 8) else None
    except OSError as err:
        raise bad_folder(folder, f"{name}: {str(err).splitlines()[0]}") from None
    if raw is None:
        raise bad_folder(folder, f"{name}: a header of {length} bytes in a file of {size} (truncated or damaged; "
                         f"at most {MAX_HEADER_BYTES >> 20} MiB)")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError):
        header = None
    if not isinstance(header, dict):
        raise bad_folder(folder, f"{name}: its header is no safetensors header")
    tensors, data_size, data_end = {}, size - 8 - length, 0
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = _DTYPES[entry["dtype"]], entry["shape"], entry["data_offsets"]
            ok = all(type(d) is int and d >= 0 for d in (*shape, start, end)) and len(shape) <= 8
            numel = math.prod(shape) if ok else -1
            ok = ok and end - start == numel * dtype.itemsize and start <= end <= data_size
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise bad_folder(folder, f"{name}: entry {str(key)[:80]!r} is damaged (dtype, shape or byte range; "
                             f"the file holds {data_size} bytes of data)")
        tensors[key] = torch.empty(shape, dtype=dtype, device="meta")
        data_end = max(data_end, end)
    if data_end != data_size:  # bytes no tensor holds: the file is not what its header describes
        raise bad_folder(folder, f"{name}: {size} bytes where its header describes {8 + length + data_end} "
                         "(8 + the header + the tensors' data; damaged or appended to)")
    return tensors


def file_size(path: str) -> int:
    """``path``'s size in bytes (0 when it cannot be read: :func:`read_safetensors_header` then says why)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def read_bytes(path: str, folder: str, size: int) -> bytes:
    """The ``size`` bytes of ``path`` (the size :func:`read_safetensors_header` checked its header against): at most
    ``size + 1`` read, so a file changed since is refused, never read whole.

    Raises:
        UsageError: an unreadable file, or one of another size (naming ``folder``).
    """
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            data = f.read(size + 1)
    except OSError as err:
        raise bad_folder(folder, f"{name}: {err.strerror or err}") from None
    if len(data) != size:
        raise bad_folder(folder, f"{name} changed while it was read ({len(data)} bytes where {size} were checked)")
    return data
