"""SBD's ``GTcls.Segmentation`` is held to the pixel limit from its array header, before anything is decoded: a
small compressed ``.mat`` may declare far more pixels than it is worth decoding."""
import numpy as np
import pytest

from encoding.datasets.layout import SBD_MAT_DIR, SBD_PNG_DIR
from encoding.datasets.prepare import sbd
from encoding.utils.images import ImageTooLarge, set_max_pixels

import scipy.io as scipy_io  # the test extra: a SciPy whose MAT-5 reader parts moved fails here, loudly
from scipy.io.matlab._mio5 import MatFile5Reader

LIMIT = 10_000


@pytest.fixture
def low_limit():
    set_max_pixels(LIMIT)
    yield LIMIT
    set_max_pixels(None)


def _savemat(path, segmentation, **fields):
    scipy_io.savemat(str(path), {"GTcls": {"Boundaries": np.ones((3, 3)), "Segmentation": segmentation, **fields}},
                     do_compression=True)
    return str(path)


@pytest.fixture
def never_decoded(monkeypatch):
    """Fail if an array of the file is decoded (SciPy's whole-array decoders and loadmat itself)."""
    def refuse(*args, **kwargs):
        raise AssertionError("the .mat data was decoded")
    reader = MatFile5Reader
    monkeypatch.setattr(reader, "read_var_array", refuse)
    monkeypatch.setattr(reader, "get_variables", refuse)
    monkeypatch.setattr("scipy.io.loadmat", refuse)
    monkeypatch.setattr("scipy.io.matlab.loadmat", refuse)
    return refuse


def test_a_segmentation_over_the_limit_is_refused_from_its_header(tmp_path, low_limit, never_decoded):
    path = _savemat(tmp_path / "big.mat", np.zeros((101, 200), np.uint8))  # 20,200 pixels > 10,000
    with pytest.raises(ImageTooLarge) as info:
        sbd.read_sbd_segmentation(path)
    message = str(info.value)
    assert path in message and "200 x 101 = 20,200 pixels" in message and "10,000" in message, message


def test_the_struct_fields_before_segmentation_are_skipped_undecoded(tmp_path, low_limit, monkeypatch):
    """``Boundaries`` (a 1000 x 1000 field, over the limit) comes first in the struct: it is stepped over, and only
    the small ``Segmentation`` is decoded, once."""
    path = str(tmp_path / "ok.mat")
    scipy_io.savemat(path, {"other": np.zeros(5), "GTcls": {"Boundaries": np.zeros((1000, 1000)),
                                                             "Segmentation": np.full((4, 6), 7, np.uint8)}},
                     do_compression=True)
    decoded = []

    class Counting:
        """SciPy's array reader, noting the dimensions of every array it decodes."""

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def array_from_header(self, header, process):
            decoded.append(list(header.dims))
            return self.inner.array_from_header(header, process)

    reader = MatFile5Reader
    initialize_read = reader.initialize_read

    def counting(self):
        initialize_read(self)
        self._matrix_reader = Counting(self._matrix_reader)
    monkeypatch.setattr(reader, "initialize_read", counting)
    label = sbd.read_sbd_segmentation(path)
    assert label.dtype == np.uint8 and label.shape == (4, 6) and (label == 7).all()
    assert decoded == [[4, 6]]


def test_a_small_segmentation_still_converts(tmp_path, low_limit):
    segmentation = np.array([[0, 1, 255], [20, 3, 0]], np.uint8)
    mat_dir = tmp_path / SBD_MAT_DIR
    mat_dir.mkdir(parents=True)
    _savemat(mat_dir / "2008_000001.mat", segmentation, CategoriesPresent=np.array([1, 3, 20]))
    _savemat(mat_dir / "2008_000002.mat", segmentation.astype(float).T)  # doubles, as MATLAB writes them
    png_dir = sbd.convert_sbd_masks(str(tmp_path), progress=False)
    assert png_dir == str(tmp_path / SBD_PNG_DIR)
    from PIL import Image
    assert (np.asarray(Image.open(tmp_path / SBD_PNG_DIR / "2008_000001.png")) == segmentation).all()
    assert (np.asarray(Image.open(tmp_path / SBD_PNG_DIR / "2008_000002.png")) == segmentation.T).all()


def test_conversion_stops_at_the_first_file_over_the_limit(tmp_path, low_limit, never_decoded):
    mat_dir = tmp_path / SBD_MAT_DIR
    mat_dir.mkdir(parents=True)
    big = _savemat(mat_dir / "2008_000003.mat", np.zeros((200, 200), np.uint8))
    with pytest.raises(ImageTooLarge, match="2008_000003.mat: image of 200 x 200"):
        sbd.convert_sbd_masks(str(tmp_path), progress=False)
    assert not (tmp_path / SBD_PNG_DIR).exists() and big
