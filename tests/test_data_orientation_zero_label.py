"""An EXIF orientation whose mask size cannot tell the reading is warned of, and mmseg's
``reduce_zero_label`` (0 = unlabelled, class k stored as k + 1) is a class-file key, hinted at where it is missed."""
import os

import numpy as np
import pytest
from PIL import Image

from encoding.datasets.folder import FolderSegmentation
from encoding.datasets.folder_meta import read_class_file
from encoding.datasets.layout import DatasetError
from encoding.datasets.scan.__main__ import main as scan_main


def _image(path, size, turn=1):
    """An RGB image of ``size`` (w, h) stored with the EXIF orientation ``turn`` (1: none)."""
    w, h = size
    im = Image.fromarray(np.random.default_rng(0).integers(0, 255, (h, w, 3), dtype=np.uint8))
    exif = im.getexif()
    if turn != 1:
        exif[0x0112] = turn
    im.save(path, exif=exif, quality=95)


def _folder(root, size=(32, 32), turns=(1, 1, 1, 1), masks=None):
    """A split-folders dataset of four pairs; ``turns``: each image's orientation, ``masks``: each mask's values."""
    for i, turn in enumerate(turns):
        split = "train" if i < 2 else "val"
        os.makedirs(os.path.join(root, split, "images"), exist_ok=True)
        os.makedirs(os.path.join(root, split, "masks"), exist_ok=True)
        _image(os.path.join(root, split, "images", f"{i}.jpg"), size, turn)
        w, h = (size[1], size[0]) if turn in (5, 6, 7, 8) else size  # the mask of the upright image's size
        mask = np.zeros((h, w), np.uint8) if masks is None else masks(i, h, w)
        if masks is None:
            mask[: h // 4] = 1
        Image.fromarray(mask).save(os.path.join(root, split, "masks", f"{i}.png"))
    return str(root)


def _turn_warnings(data):
    return [w for w in data.scan.warnings if "EXIF orientation" in w]


# -- 1. a mask whose size cannot tell the reading: warned of, once, with the first file and the fix --------------
@pytest.mark.parametrize("size, turn", [((32, 32), 6), ((32, 32), 8), ((40, 24), 3), ((40, 24), 2)])
def test_an_orientation_the_mask_size_cannot_tell_is_warned_of_once(tmp_path, size, turn):
    root = _folder(tmp_path / "d", size, turns=(1, turn, turn, 1))
    data = FolderSegmentation(root, split="val", mode="testval", scan_cache=False)
    (warning,) = _turn_warnings(data)
    assert warning.startswith("2 image(s)") and f"train{os.sep}images{os.sep}1.jpg" in warning
    assert f"orientation {turn}" in warning and "upright image, as displayed" in warning
    assert "exif_transpose" in warning


@pytest.mark.parametrize("turns", [(1, 1, 1, 1), (6, 6, 1, 1)])
def test_no_warning_where_there_is_no_orientation_or_the_size_tells(tmp_path, turns):
    root = _folder(tmp_path / "d", (40, 24), turns=turns)  # 6 on 40x24: a stored-size mask would be refused
    assert _turn_warnings(FolderSegmentation(root, split="val", mode="testval", scan_cache=False)) == []


def test_a_mask_carrying_the_image_orientation_is_not_warned_of(tmp_path):
    root = _folder(tmp_path / "d", (32, 32), turns=(1, 1, 1, 1))
    exif = Image.Exif()
    exif[0x0112] = 6
    for split, i in (("train", 1), ("val", 2)):
        _image(os.path.join(root, split, "images", f"{i}.jpg"), (32, 32), 6)
        Image.fromarray(np.eye(32, dtype=np.uint8)).save(os.path.join(root, split, "masks", f"{i}.png"),
                                                         exif=exif.tobytes())
    assert _turn_warnings(FolderSegmentation(root, split="val", mode="testval", scan_cache=False)) == []


def test_the_scan_tool_prints_the_orientation_warning_also_from_its_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = _folder(tmp_path / "d", (32, 32), turns=(6, 1, 1, 1))
    for _ in range(2):  # the second scan reads the cached records
        text = scan_main([root])
        assert "warning: 1 image(s) carry an EXIF orientation" in text
    assert capsys.readouterr().out.count("EXIF orientation") == 2


# -- 2. reduce_zero_label: 0 ignored, k read as class k - 1, on every path that reads the masks -------------------
def _zero_label(root, class_file, name="classes.yaml"):
    """Masks of value 0 (unlabelled, rows 24..) and the classes 1..3 (class 3 in three masks of four)."""
    def values(i, h, w):
        mask = np.zeros((h, w), np.uint8)
        mask[:10], mask[10:20], mask[20:24] = 1, 2, 3 if i else 2
        return mask
    _folder(root, (32, 32), masks=values)
    if class_file is not None:
        with open(os.path.join(root, name), "w") as f:
            f.write(class_file)
    return str(root)


@pytest.mark.parametrize("name, text", [
    ("classes.yaml", "classes: [road, car, tree]\nreduce_zero_label: true\n"),
    ("classes.json", '{"classes": ["road", "car", "tree"], "reduce_zero_label": true}'),
    ("classes.txt", "reduce_zero_label: true\nroad\ncar\ntree\n"),
    ("classes.txt", "reduce_zero_label: true\n1 road\n2 car\n3 tree\n"),  # numbered by their mask values
])
def test_reduce_zero_label_ignores_0_and_reads_k_as_class_k_minus_1(tmp_path, name, text):
    root = _zero_label(tmp_path / "d", text, name)
    assert read_class_file(root).reduce_zero_label
    data = FolderSegmentation(root, split="val", mode="testval", scan_cache=False)
    assert data.CLASSES == ("road", "car", "tree") and data.pred_offset == 1
    mask = data[1][1].numpy()
    assert (mask[:10] == 0).all() and (mask[10:20] == 1).all() and (mask[20:24] == 2).all()
    assert (mask[24:] == -1).all()  # value 0: ignored, neither trained nor scored
    scan = data.scan
    assert scan.ignored == 4 * 8 * 32 and scan.pixels == [4 * 10 * 32, 4 * 10 * 32 + 32 * 4, 3 * 4 * 32]
    table = scan.table().splitlines()
    assert table[1].split()[:2] == ["1", "road"] and table[-1].split()[:2] == ["0,255", "(ignored)"]


def test_reduce_zero_label_changes_the_label_encoding_the_class_counts_are_cached_on(tmp_path):
    plain = _zero_label(tmp_path / "a", "classes: [other, road, car, tree]\n")
    reduced = _zero_label(tmp_path / "b", "classes: [road, car, tree]\nreduce_zero_label: true\n")
    a = FolderSegmentation(plain, split="train", scan_cache=False)
    b = FolderSegmentation(reduced, split="train", scan_cache=False)
    assert a.label_encoding() != b.label_encoding()
    assert b.label_table()[:5].tolist() == [255, 0, 1, 2, 254]


def test_an_n_name_class_file_over_0_to_n_masks_is_refused_with_the_reduce_zero_label_hint(tmp_path):
    root = _zero_label(tmp_path / "d", "road\ncar\ntree\n", "classes.txt")
    with pytest.raises(DatasetError, match="label values \\[3\\] are outside the 3 classes") as err:
        FolderSegmentation(root, split="val", mode="testval", scan_cache=False)
    assert str(err.value).endswith(f"if 0 means unlabelled, add reduce_zero_label: true to "
                                   f"{os.path.join(root, 'classes.txt')}")


def test_no_hint_where_the_values_go_past_n(tmp_path):
    root = _zero_label(tmp_path / "d", "road\ncar\n", "classes.txt")  # values 0..3 with two names: not 0..n
    with pytest.raises(DatasetError, match="outside the 2 classes") as err:
        FolderSegmentation(root, split="val", mode="testval", scan_cache=False)
    assert "reduce_zero_label" not in str(err.value)


def test_ignore_index_0_is_refused_with_the_reduce_zero_label_hint(tmp_path):
    root = _zero_label(tmp_path / "d", "classes: [road, car, tree]\nignore_index: 0\n")
    with pytest.raises(DatasetError, match="ignore_index 0 must be .*; if 0 means unlabelled, add reduce_zero_label: "
                                           "true"):
        read_class_file(root)


@pytest.mark.parametrize("text, problem", [
    ("classes: [road, car, tree]\nreduce_zero_label: 'yes'\n", "reduce_zero_label must be true or false"),
    ("classes: [road, car, tree]\nreduce_zero_label: true\nignore_index: 3\n", "must be an integer in \\[4, 255\\]"),
])
def test_a_bad_reduce_zero_label_class_file_is_refused(tmp_path, text, problem):
    root = _zero_label(tmp_path / "d", text)
    with pytest.raises(DatasetError, match=problem):
        read_class_file(root)
