"""SBD's MATLAB labels (``pascal_aug``) converted once into label PNGs, and its ``trainval`` split.

SBD ships its labels as MATLAB files (struct ``GTcls`` with field ``Segmentation``). They are read with SciPy (the
``prepare`` extra, used only here) at prepare time (``python -m encoding.datasets.prepare pascal``) into
``cls_png/<id>.png``; :class:`~encoding.datasets.VOCAugSegmentation` reads those PNGs like every other dataset.
The size of ``GTcls.Segmentation`` is read from its array header (SciPy's MAT-file 5 reader, array by array) and
held to the pixel limit of every image (:func:`~encoding.utils.images.max_pixels`) before the array is decoded: a
small compressed file may declare gigabytes.
"""
from __future__ import annotations

import os
import zlib
from types import SimpleNamespace
from typing import Any, BinaryIO, Tuple

import numpy as np
from PIL import Image
from ...errors import EncodingError, MissingDependency
from ...utils.images import check_pixels
from ...utils.progress import progress_bar as tqdm

from ..layout import SBD_MAT_DIR, SBD_PNG_DIR, DatasetError, read_split_file
from ...utils.files import atomic_write, staged_dir

__all__ = ["SBD_LABEL_VALUES", "read_sbd_segmentation", "convert_sbd_masks", "write_sbd_trainval"]


#: The values of an SBD label: the 20 classes, background 0, and 255 (ignore).
SBD_LABEL_VALUES = frozenset(range(21)) | {255}


def _scipy_mat() -> Tuple[SimpleNamespace, Tuple[type, ...]]:
    """SciPy's MAT-file 5 reader parts (``scipy.io.matlab``'s own modules, SciPy >= 1.8) and what they raise for a
    file that is not (or no longer) a MATLAB file."""
    try:
        from scipy.io.matlab import MatReadError, matfile_version
        from scipy.io.matlab._mio5 import MatFile5Reader
        from scipy.io.matlab._mio5_params import miCOMPRESSED, miMATRIX, mxSTRUCT_CLASS
        from scipy.io.matlab._streams import ZlibInputStream
    except ImportError as e:
        raise MissingDependency("converting SBD's .mat labels needs SciPy >= 1.8: pip install scipy (or the 'prepare' "
                                "extra); only once: the labels are then saved as PNGs and read without it") from e
    mat = SimpleNamespace(version=matfile_version, Reader=MatFile5Reader, Zlib=ZlibInputStream,
                          COMPRESSED=miCOMPRESSED, MATRIX=miMATRIX, STRUCT=mxSTRUCT_CLASS)
    return mat, (MatReadError, ValueError, OSError, TypeError, IndexError, KeyError, EOFError, zlib.error,
                 NotImplementedError)


def _variable(reader: Any, f: BinaryIO, mat: SimpleNamespace, name: bytes) -> Tuple[Any, Any]:
    """The array header of the top-level variable ``name`` and the stream its contents follow in (a compressed
    variable's is inflated as it is read), or ``(None, None)``; the other variables are skipped unread."""
    while not reader.end_of_stream():
        mdtype, byte_count = reader._file_reader.read_full_tag()
        after = f.tell() + byte_count
        stream = mat.Zlib(f, byte_count) if mdtype == mat.COMPRESSED else f
        reader._matrix_reader.set_stream(stream)
        if mdtype == mat.COMPRESSED:
            mdtype, _ = reader._matrix_reader.read_full_tag()
        if mdtype == mat.MATRIX:
            header = reader._matrix_reader.read_header(False)
            if header.name == name:
                return header, stream
        f.seek(after)
    return None, None


def _field(reader: Any, stream: Any, mat: SimpleNamespace, field: str) -> Any:
    """The array header of ``field`` of the 1 x 1 struct whose fields ``stream`` is at; the fields before it are
    skipped (inflated, if compressed, but never decoded). ``None`` if the struct has no such (non-empty) field."""
    for name in reader._matrix_reader.read_fieldnames():
        mdtype, byte_count = reader._matrix_reader.read_full_tag()
        start = stream.tell()
        if name == field and mdtype == mat.MATRIX and byte_count > 0:
            return reader._matrix_reader.read_header(False)
        stream.seek(start + byte_count)
    return None


def _segmentation(f: BinaryIO, path: str, mat: SimpleNamespace) -> Any:
    """``GTcls.Segmentation`` of the open MATLAB file ``f``, decoded only once its size, read from its header, is
    within :func:`~encoding.utils.images.max_pixels` (nothing else of the file is decoded)."""
    if mat.version(f)[0] != 1:
        raise DatasetError(path, "not a MATLAB 5 file (the format of SBD's labels)")
    reader = mat.Reader(f, squeeze_me=True, struct_as_record=False)
    f.seek(0)
    reader.initialize_read()
    reader.read_file_header()
    header, stream = _variable(reader, f, mat, b"GTcls")
    field = None
    if header is not None and header.mclass == mat.STRUCT and int(np.prod(header.dims)) == 1:
        field = _field(reader, stream, mat, "Segmentation")
    if field is None:
        raise DatasetError(path, "expected a struct GTcls with a Segmentation field (SBD cls format)")
    dims = [int(d) for d in field.dims] or [0]
    check_pixels(int(np.prod(dims[1:])), dims[0], path)  # height x width (x ...), before a byte is decoded
    return reader._matrix_reader.array_from_header(field, 1)


def _labels(segmentation: Any, path: str) -> np.ndarray:
    """``segmentation`` as uint8, refused unless every value is a whole number of :data:`SBD_LABEL_VALUES` (a cast
    alone would wrap 300 into 44, -1 into 255 and 2.7 into 2)."""
    array = np.asarray(segmentation)
    if array.ndim != 2 or array.dtype.kind not in "biuf" or array.size == 0:
        raise DatasetError(path, f"GTcls.Segmentation is not a 2-D array of numbers (dtype {array.dtype}, "
                                 f"shape {array.shape})")
    values = np.unique(array)
    bad = [v for v in values.tolist() if v not in SBD_LABEL_VALUES]
    if bad:
        raise DatasetError(path, f"label values must be whole numbers in 0..20 or 255; found {bad[:5]}")
    return array.astype(np.uint8)


def read_sbd_segmentation(path: str) -> np.ndarray:
    """The ``GTcls.Segmentation`` array (uint8, 255 = ignore) of one SBD ``cls/<id>.mat`` file.

    Its size is read from the array's header and checked against :func:`~encoding.utils.images.max_pixels` before it
    is decoded; the struct's other fields (``Boundaries``...) are never decoded.

    Raises:
        DatasetError: the file is missing, not a MATLAB 5 file, truncated, lacks ``GTcls.Segmentation``, or holds a
            value that is not a whole number in ``0..20`` or ``255``.
        ImageTooLarge: the segmentation has more pixels than the limit (nothing of it was decoded).
        ImportError: SciPy is not installed (``pip install "encoding[prepare]"``).
    """
    mat, unreadable = _scipy_mat()
    try:
        with open(path, "rb") as f:
            segmentation = _segmentation(f, path, mat)
    except FileNotFoundError:
        raise DatasetError(path, "mask file is missing") from None
    except EncodingError:  # ours (DatasetError, ImageTooLarge) are ValueErrors too: not to be reworded below
        raise
    except unreadable as e:
        raise DatasetError(path, f"cannot read .mat label ({type(e).__name__}: {e})") from e
    return _labels(segmentation, path)


def convert_sbd_masks(base: str, *, overwrite: bool = False, progress: bool = True) -> str:
    """Convert every ``<base>/cls/<id>.mat`` into ``<base>/cls_png/<id>.png``, all or nothing.

    Args:
        base: the SBD dataset folder (``VOCaug/dataset``).
        overwrite: convert again even when the PNG folder exists.
        progress: show a progress bar.

    Returns:
        The PNG folder.
    """
    mat_dir, png_dir = os.path.join(base, SBD_MAT_DIR), os.path.join(base, SBD_PNG_DIR)
    if not overwrite and os.path.isdir(png_dir):
        return png_dir
    if not os.path.isdir(mat_dir):
        raise DatasetError(mat_dir, "SBD label folder is missing; is the archive the right one?")
    names = sorted(name for name in os.listdir(mat_dir) if name.endswith(".mat"))
    with staged_dir(png_dir, replace=True) as staging:
        for name in tqdm(names, desc="SBD labels to PNG", disable=not progress):
            label = read_sbd_segmentation(os.path.join(mat_dir, name))
            Image.fromarray(label).save(os.path.join(staging, name[:-len(".mat")] + ".png"))
    return png_dir


def write_sbd_trainval(base: str) -> str:
    """Write SBD's ``trainval.txt`` (train + val, de-duplicated, in order), the split PyTorch-Encoding reads.

    Returns:
        The list file ``<base>/trainval.txt``.
    """
    ids = read_split_file(os.path.join(base, "train.txt")) + read_split_file(os.path.join(base, "val.txt"))
    return atomic_write(os.path.join(base, "trainval.txt"), "".join(i + "\n" for i in dict.fromkeys(ids)))
