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


def _count_decodes(monkeypatch):
    """The files whose pixels Pillow decodes, one entry per decode (``ImageFile.load`` of an image not loaded yet)."""
    from PIL import ImageFile
    decoded, original = [], ImageFile.ImageFile.load

    def load(self):
        if self.tile:
            decoded.append(os.path.basename(self.filename))
        return original(self)
    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    return decoded


def test_demo_decodes_each_image_once_and_shows_progress(tiny_run, tmp_path, monkeypatch, capsys):
    """The up-front check reads the headers only (size against the pixel limit); each image is decoded once, when
    it is segmented (it was decoded twice: the check decoded every pixel). Several images draw a progress bar on
    stderr (``encoding.utils.progress``), each image keeps its line on stdout."""
    _, checkpoint, _ = tiny_run
    paths = _images(str(tmp_path / "photos"), ["a.png", "b.jpg", "c.png"], size=(40, 32))
    decoded = _count_decodes(monkeypatch)
    monkeypatch.setenv("ENCODING_PROGRESS", "lines")
    capsys.readouterr()
    load_script("demo").main(paths + ["--resume", checkpoint, "--out-dir", str(tmp_path / "out")])
    assert sorted(decoded) == ["a.png", "b.jpg", "c.png"], decoded
    out, err = capsys.readouterr()
    assert [line.split(":")[0] for line in out.strip().splitlines()] == paths
    assert "demo: 100%" in err and "3/3" in err, err


def _truncate(path):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])  # the header is whole, the pixels are cut


def test_demo_refuses_a_bad_header_before_any_work_and_a_truncated_image_when_reached(tiny_run, tmp_path, capsys,
                                                                                      monkeypatch):
    """A file whose header is no image's, or whose size is over the pixel limit, is refused before any work; one
    whose header is fine but whose pixels are cut stops the run in one line naming it when it is reached: the
    images before it keep their outputs (docs/training.md)."""
    _, checkpoint, _ = tiny_run
    a, b, c = _images(str(tmp_path / "photos"), ["a.png", "b.png", "c.png"], size=(64, 48))
    monkeypatch.setenv("ENCODING_PROGRESS", "off")  # stderr holds the error alone
    demo = load_script("demo")
    (tmp_path / "notes.png").write_text("not an image")
    capsys.readouterr()
    status = demo.cli([a, str(tmp_path / "notes.png"), "--resume", checkpoint, "--out-dir", str(tmp_path / "o1")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "notes.png" in err[0] and "cannot decode image" in err[0], err
    assert not (tmp_path / "o1").exists()
    monkeypatch.setenv("ENCODING_MAX_PIXELS", "1000")
    status = demo.cli([a, b, "--resume", checkpoint, "--out-dir", str(tmp_path / "o2")])
    monkeypatch.delenv("ENCODING_MAX_PIXELS")
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "a.png" in err[0] and "over the limit" in err[0], err
    assert not (tmp_path / "o2").exists()
    _truncate(b)
    status = demo.cli([a, b, c, "--resume", checkpoint, "--out-dir", str(tmp_path / "o3")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "b.png" in err[0] and "cannot decode image" in err[0], err
    assert sorted(os.listdir(tmp_path / "o3")) == ["a_mask.png", "a_overlay.png"]
