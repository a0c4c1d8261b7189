"""demo.py takes its images as users type them: files, folders (every image in it, sorted) and quoted globs."""
import os

import pytest
from conftest import load_script
from PIL import Image

from encoding.inference.demo import expand_images
from encoding.errors import UsageError


def _images(folder, names, size=(24, 20)):
    os.makedirs(folder, exist_ok=True)
    for i, name in enumerate(names):
        Image.new("RGB", size, (40 * i, 100, 200)).save(os.path.join(folder, name))
    return [os.path.join(folder, name) for name in names]


def test_expand_images_reads_folders_and_globs_in_order(tmp_path):
    photos = tmp_path / "photos"
    b, a, c = _images(str(photos), ["b.jpg", "a.png", "c.JPG"])
    (photos / "notes.txt").write_text("not an image")
    (photos / ".hidden.jpg").write_bytes(b"")
    _images(str(photos / "sub"), ["deeper.png"])  # a folder stands for its own images, not its sub-folders'
    loose = _images(str(tmp_path), ["z.png"])[0]
    assert expand_images([str(photos)]) == [a, b, c]
    assert expand_images([loose, str(photos / "*.jpg")]) == [loose, b]  # a quoted glob the shell left alone
    assert expand_images([str(tmp_path / "**" / "*.png")]) == sorted([a, str(photos / "sub" / "deeper.png"), loose])
    missing = str(tmp_path / "missing.jpg")
    assert expand_images([missing]) == [missing]  # a plain file name is checked when it is read
    with pytest.raises(UsageError, match=r"no file matches this pattern") as err:
        expand_images([str(photos / "*.tif")])
    assert str(photos / "*.tif") in str(err.value)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="the folder holds no image file"):
        expand_images([str(tmp_path / "empty")])


def test_a_file_named_like_a_glob_is_that_file(tmp_path):
    odd = _images(str(tmp_path), ["shot[1].png"])[0]
    assert expand_images([odd]) == [odd]


def test_demo_segments_a_folder_and_a_quoted_glob(tiny_run, tmp_path, capsys):
    _, checkpoint, _ = tiny_run
    photos = tmp_path / "photos"
    _images(str(photos), ["b.jpg", "a.png"], size=(40, 32))
    more = tmp_path / "more"
    _images(str(more), ["x.jpg", "y.png"], size=(40, 32))
    demo = load_script("demo")
    written = demo.main([str(photos), str(more / "*.jpg"), "--resume", checkpoint, "--out-dir", str(tmp_path / "out")])
    assert [os.path.basename(mask) for mask, _ in written] == ["a_mask.png", "b_mask.png", "x_mask.png"]
    assert all(os.path.isfile(p) for pair in written for p in pair)
    assert Image.open(written[0][0]).size == (40, 32)
    capsys.readouterr()
    status = demo.cli([str(more / "*.tif"), "--resume", checkpoint, "--out-dir", str(tmp_path / "none")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "no file matches this pattern" in err[0], err
    assert not (tmp_path / "none").exists()


def test_demo_refuses_its_own_input_and_a_file_as_out_dir_in_one_line(tiny_run, tmp_path, capsys):
    """An output that is one of the inputs (``x.png`` writes ``x_mask.png``, given too) was refused by a
    ``ValueError`` that demo.py took for a bug: its traceback and exit status 1. An ``--out-dir`` that is a file
    failed after the network ran, ``[Errno 17] File exists``. Both are one line, exit status 2, before any work."""
    _, checkpoint, _ = tiny_run
    x, x_mask = _images(str(tmp_path), ["x.png", "x_mask.png"])
    before = open(x_mask, "rb").read()
    demo = load_script("demo")
    capsys.readouterr()
    for argv, says in (([x, x_mask, "--out-dir", str(tmp_path), "--overwrite"], "that is the input file"),
                       ([x, "--out-dir", x_mask], f"--out-dir {x_mask}: that is a file; give a folder")):
        status = demo.cli([*argv, "--resume", checkpoint])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1 and says in err[0], err
    assert open(x_mask, "rb").read() == before and sorted(os.listdir(tmp_path)) == ["x.png", "x_mask.png"]
