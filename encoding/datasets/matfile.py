"""A small reader for MATLAB level-5 ``.mat`` files (the format of the SBD / VOC-aug ``cls/*.mat`` labels).

It covers what segmentation label files use -- numeric and logical arrays, character arrays, structs, cell arrays,
sparse matrices and zlib-compressed variables (MATLAB's default ``-v7``) -- so ``pascal_aug`` needs no SciPy.
HDF5-based ``-v7.3`` files and MATLAB objects are refused with a clear error.

Example:
    >>> seg = load_mat("VOCaug/dataset/cls/2008_000002.mat")["GTcls"]["Segmentation"]  # doctest: +SKIP
"""
from __future__ import annotations

import struct
import zlib
from typing import Any, Dict, List, NamedTuple, Tuple

import numpy as np

__all__ = ["load_mat", "MatFileError", "SparseMatrix"]

# Data element types (miXXX) -> numpy dtype (without byte order).
_MI_DTYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8",
              16: "u1", 17: "u2", 18: "u4"}
_MI_MATRIX, _MI_COMPRESSED = 14, 15
# Array classes (mxXXX) -> numpy dtype of the resulting array.
_MX_NUMERIC = {6: "f8", 7: "f4", 8: "i1", 9: "u1", 10: "i2", 11: "u2", 12: "i4", 13: "u4", 14: "i8", 15: "u8"}
_MX_CELL, _MX_STRUCT, _MX_OBJECT, _MX_CHAR, _MX_SPARSE = 1, 2, 3, 4, 5
_FLAG_COMPLEX, _FLAG_LOGICAL = 0x0800, 0x0200


class MatFileError(ValueError):
    """The file is not a level-5 MAT file this reader understands."""


class SparseMatrix(NamedTuple):
    """A MATLAB sparse matrix kept in compressed-column form (call :meth:`toarray` for a dense copy)."""

    shape: Tuple[int, int]
    row_indices: np.ndarray
    column_starts: np.ndarray
    values: np.ndarray

    def toarray(self) -> np.ndarray:
        dense = np.zeros(self.shape, dtype=self.values.dtype)
        for col in range(self.shape[1]):
            start, stop = self.column_starts[col], self.column_starts[col + 1]
            dense[self.row_indices[start:stop], col] = self.values[start:stop]
        return dense


class _Reader:
    def __init__(self, data: bytes, endian: str) -> None:
        self.data, self.endian = data, endian

    def tag(self, pos: int) -> Tuple[int, int, int, int]:
        """Return ``(type, nbytes, data_start, next_element)`` of the element at ``pos``."""
        if pos + 8 > len(self.data):
            raise MatFileError("truncated data element")
        word, nbytes = struct.unpack_from(self.endian + "II", self.data, pos)
        if word >> 16:  # small data element: 2-byte size and type packed in the first word, data in the second
            return word & 0xFFFF, word >> 16, pos + 4, pos + 8
        end = pos + 8 + nbytes
        if end > len(self.data):
            raise MatFileError("truncated data element")
        return word, nbytes, pos + 8, end + (-nbytes % 8)

    def numbers(self, pos: int) -> Tuple[np.ndarray, int]:
        mtype, nbytes, start, nxt = self.tag(pos)
        if mtype not in _MI_DTYPES:
            raise MatFileError(f"unexpected data type {mtype} for numeric data")
        dtype = np.dtype(_MI_DTYPES[mtype]).newbyteorder(self.endian)
        return np.frombuffer(self.data, dtype=dtype, count=nbytes // dtype.itemsize, offset=start), nxt

    def matrix(self, pos: int, end: int) -> Tuple[str, Any]:
        """Parse the body of an miMATRIX element spanning ``[pos, end)``; return ``(name, value)``."""
        if pos >= end:  # empty element (e.g. an empty cell entry)
            return "", np.zeros((0, 0))
        flags, pos = self.numbers(pos)
        mx_class, flag_bits = int(flags[0]) & 0xFF, int(flags[0])
        dims, pos = self.numbers(pos)
        shape = tuple(int(d) for d in dims)
        name_bytes, pos = self.numbers(pos)
        name = name_bytes.tobytes().decode("ascii", "replace")
        if mx_class in _MX_NUMERIC:
            return name, self._numeric(pos, shape, mx_class, flag_bits)
        if mx_class == _MX_CHAR:
            chars, _ = self.numbers(pos)
            text = "".join(chr(c) for c in chars.astype(np.int64))
            return name, text
        if mx_class == _MX_CELL:
            return name, self._cell(pos, end, shape)
        if mx_class == _MX_STRUCT:
            return name, self._struct(pos, end, shape)
        if mx_class == _MX_SPARSE:
            rows, pos = self.numbers(pos)
            cols, pos = self.numbers(pos)
            values, _ = self.numbers(pos)
            if flag_bits & _FLAG_LOGICAL:
                values = values.astype(bool)
            return name, SparseMatrix(shape[:2], rows.astype(np.int64), cols.astype(np.int64), values)
        raise MatFileError(f"unsupported MATLAB array class {mx_class} (objects and function handles)")

    def _numeric(self, pos: int, shape: Tuple[int, ...], mx_class: int, flag_bits: int) -> np.ndarray:
        real, pos = self.numbers(pos)
        array = real.astype(_MX_NUMERIC[mx_class])
        if flag_bits & _FLAG_COMPLEX:
            imag, _ = self.numbers(pos)
            array = array + 1j * imag.astype(_MX_NUMERIC[mx_class])
        if flag_bits & _FLAG_LOGICAL:
            array = array.astype(bool)
        return array.reshape(shape, order="F")

    def _children(self, pos: int, end: int, count: int) -> List[Any]:
        values = []
        for _ in range(count):
            mtype, nbytes, start, nxt = self.tag(pos)
            if mtype != _MI_MATRIX:
                raise MatFileError(f"expected a matrix element, found type {mtype}")
            values.append(self.matrix(start, start + nbytes)[1])
            pos = nxt
        return values

    def _cell(self, pos: int, end: int, shape: Tuple[int, ...]) -> List[Any]:
        return self._children(pos, end, int(np.prod(shape)))

    def _struct(self, pos: int, end: int, shape: Tuple[int, ...]) -> Any:
        length, pos = self.numbers(pos)
        raw_names, pos = self.numbers(pos)
        width = int(length[0])
        blob = raw_names.tobytes()
        fields = [blob[i:i + width].split(b"\0", 1)[0].decode("ascii") for i in range(0, len(blob), width)]
        count = int(np.prod(shape))
        flat = self._children(pos, end, count * len(fields))
        records = [dict(zip(fields, flat[i * len(fields):(i + 1) * len(fields)])) for i in range(count)]
        return records[0] if count == 1 else records


def _parse(data: bytes, path: str) -> Dict[str, Any]:
    if len(data) < 128:
        raise MatFileError(f"{path}: too short for a MAT file header")
    if data[:19] == b"MATLAB 7.3 MAT-file" or data[:8] == b"\x89HDF\r\n\x1a\n":
        raise MatFileError(f"{path}: MATLAB -v7.3 (HDF5) files are not supported; re-save with -v7")
    indicator = data[126:128]
    if indicator == b"IM":
        endian = "<"
    elif indicator == b"MI":
        endian = ">"
    else:
        raise MatFileError(f"{path}: not a MATLAB level-5 MAT file")
    variables: Dict[str, Any] = {}
    pos = 128
    while pos + 8 <= len(data):
        reader = _Reader(data, endian)
        mtype, nbytes, start, nxt = reader.tag(pos)
        if mtype == _MI_COMPRESSED:
            try:
                inner = zlib.decompress(data[start:start + nbytes])
            except zlib.error as e:
                raise MatFileError(f"{path}: corrupt compressed variable ({e})") from e
            nxt = start + nbytes  # compressed elements are not padded
            sub = _Reader(inner, endian)
            mtype, nbytes, start, _ = sub.tag(0)
            reader = sub
        if mtype == _MI_MATRIX:
            name, value = reader.matrix(start, start + nbytes)
            variables[name] = value
        pos = nxt
    return variables


def load_mat(path: str) -> Dict[str, Any]:
    """Read the variables of a level-5 MAT file.

    Structs become ``dict`` (1x1) or lists of dicts, cell arrays lists (column-major order), numeric arrays numpy
    arrays in MATLAB's shape, char arrays ``str`` and sparse matrices :class:`SparseMatrix`.

    Args:
        path: the ``.mat`` file.

    Returns:
        ``{variable name: value}``.

    Raises:
        MatFileError: not a MAT file, truncated, corrupt, or an unsupported feature (``-v7.3``, objects).
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        return _parse(data, path)
    except (struct.error, ValueError) as e:  # MatFileError is a ValueError
        message = str(e)
        if not message.startswith(str(path)):
            message = f"{path}: malformed MAT file ({message})"
        raise MatFileError(message) from e
