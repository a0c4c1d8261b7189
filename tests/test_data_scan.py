"""The folder dataset's scan tells the truth (issue 43): every bad file named in one run, the label audit, the one
orientation rule, bounded memory, names with spaces and newlines, hostile class files, nothing written into the
data root. Each case is built from real image files (PNG, JPEG, EXIF-rotated, truncated, 16-bit, grey, 0/255) and
checks the one-line refusal or warning and that nothing was written (no run folder, the data root unchanged)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import ROOT, load_script
from encoding.datasets import FolderSegmentation
from encoding.datasets import DatasetError
from encoding.datasets.metadata import dataset_metadata
from encoding.datasets.pairing import read_pair_list
from folder_data import make_folder, photo, save_rotated_jpeg, tree, truncate

TINY = ["--crop-size", "16", "--base-size", "24", "--batch-size", "4", "--workers", "0", "--epochs", "1"]
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def train():
    return load_script("train")


def _photos(root, n=6, size=(32, 24), classes=None, mask=None, image_ext=".jpg"):
    """``root/images`` of real photos (JPEG) + ``root/masks`` (PNG): ``mask(i, h, w)`` gives each mask (default: a
    disc of class 1 + i % 2 on background 0, a 255 top row)."""
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    os.makedirs(os.path.join(root, "masks"), exist_ok=True)
    w, h = size
    for i in range(n):
        Image.fromarray(photo(w, h, i)).save(os.path.join(root, "images", f"{i:04d}{image_ext}"), quality=92)
        if mask is not None:
            m = mask(i, h, w)
        else:
            m = np.zeros((h, w), np.uint8)
            m[6:18, 8:24] = 1 + i % 2
            m[0] = 255
        Image.fromarray(m).save(os.path.join(root, "masks", f"{i:04d}.png"))
    if classes is not None:
        with open(os.path.join(root, "classes.txt"), "w", encoding="utf-8") as f:
            f.write(classes)
    return root


def _refused(train, capsys, root, out, *extra):
    """Run train.py on ``root``: it must stop with status 2 and one line, leave no run folder and not touch the
    data root; returns that line."""
    before = tree(root)
    status = train.cli(["--dataset", "folder", "--data-root", str(root), "--output-dir", str(out), *TINY, *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, err
    assert not os.path.exists(out) and tree(root) == before
    return err[0]


# -- 1. a foreground class silently ignored: 0/255 masks with a two-class file -----------------------------------
def _zero_255(i, h, w):
    m = np.zeros((h, w), np.uint8)
    m[:, : w // 2 + 1] = 255
    return m


def test_0_255_masks_with_a_two_class_file_are_refused_with_the_hint(train, capsys, tmp_path):
    root = _photos(str(tmp_path / "d"), classes="background\nforeground\n", mask=_zero_255)
    line = _refused(train, capsys, root, tmp_path / "runs")
    assert "classes.txt: class 'foreground' has no pixels while value 255 covers 53.1 % of the mask pixels (the " \
           "masks hold only 0 and 255); did you mean --binary, or masks with values 0/1?" in line
    data = FolderSegmentation(root, binary=True, split="val", mode="testval")  # what the hint says works
    assert data.scan.binary_255 and sorted(data[0][1].unique().tolist()) == [0, 1]
    assert dataset_metadata(data)["ignore_index"] is None  # 255 is the foreground: no pixel value is ignored
    assert data.scan.pixels[1] == 6 * 24 * 17 and data.scan.ignored == 0
    assert train.cli(["--dataset", "folder", "--data-root", root, "--output-dir", str(tmp_path / "runs"), *TINY,
                      "--binary"]) == 0
    assert "background 46.9%, foreground 53.1%; ignored 0.0%" in capsys.readouterr().out


# -- 2. JPEG masks ----------------------------------------------------------------------------------------------
def test_jpeg_masks_are_refused_as_lossy(train, capsys, tmp_path):
    root = _photos(str(tmp_path / "d"), classes="background\nred\nblue\n")
    masks = os.path.join(root, "masks")
    for name in ("0001", "0002"):
        values = np.array(Image.open(os.path.join(masks, name + ".png")))
        os.remove(os.path.join(masks, name + ".png"))
        Image.fromarray(values).save(os.path.join(masks, name + ".jpg"), quality=95)
    line = _refused(train, capsys, root, tmp_path / "runs")
    assert "2 bad files" in line and "2 lossy masks (JPEG" in line and "masks must be PNG or another lossless " \
           "format" in line and "masks/0001.jpg" in line and "masks/0002.jpg" in line
    os.remove(os.path.join(masks, "0002.jpg"))
    os.remove(os.path.join(root, "images", "0002.jpg"))
    with pytest.raises(DatasetError, match="mask is JPEG, a lossy format: .*save masks as PNG") as err:
        FolderSegmentation(root)
    assert err.value.path == os.path.join(masks, "0001.jpg")


# -- 3. a truncated JPEG is caught by the scan, before anything is written -------------------------------------
@pytest.mark.parametrize("extra", [[], ["--verify-data"]])
def test_a_truncated_jpeg_is_refused_before_the_run_folder(train, capsys, tmp_path, extra):
    root = _photos(str(tmp_path / "d"), size=(64, 48), mask=lambda i, h, w: np.full((h, w), i % 2, np.uint8))
    bad = truncate(os.path.join(root, "images", "0003.jpg"), 0.6)
    assert Image.open(bad).size == (64, 48)  # the header is intact: only decoding finds it
    line = _refused(train, capsys, root, tmp_path / "runs", *extra)
    assert bad in line and "cannot decode image" in line and "truncated" in line


# -- 4. one orientation rule for the scan and the loader --------------------------------------------------------
def test_the_scan_and_the_loader_apply_the_same_exif_orientation(tmp_path):
    root = str(tmp_path / "d")
    _photos(root, n=4, size=(30, 20), mask=lambda i, h, w: np.full((h, w), i % 2, np.uint8))
    turned = os.path.join(root, "images", "0002.jpg")
    save_rotated_jpeg(turned, photo(30, 20, 2), 6)  # stored 30 x 20, shown 20 x 30
    with pytest.raises(DatasetError, match=r"mask size 30x20 \(WxH\) differs from its image .*0002.jpg \(20x30, as "
                                        r"displayed\)"):
        FolderSegmentation(root)  # the mask matches the stored photo, not the one the loader reads
    Image.fromarray(np.ones((30, 20), np.uint8)).save(os.path.join(root, "masks", "0002.png"))  # upright mask
    data = FolderSegmentation(root, split="train", mode="testval", val_fraction=0.25)
    data.images, data.masks = [turned], [os.path.join(root, "masks", "0002.png")]
    image, mask = data[0]
    assert tuple(image.shape[-2:]) == (30, 20) == tuple(mask.shape) and (mask == 1).all()
    exif = Image.Exif()  # a mask stored as the photo is, with the same orientation tag: upright alike
    exif[0x0112] = 6
    stored = np.zeros((20, 30), np.uint8)
    stored[:, :5] = 1  # the stored left edge: the top once turned
    Image.fromarray(stored).save(os.path.join(root, "masks", "0002.png"), exif=exif.tobytes())
    data = FolderSegmentation(root, split="train", mode="testval", val_fraction=0.25, scan_cache=False)
    data.images, data.masks = [turned], [os.path.join(root, "masks", "0002.png")]
    mask = data[0][1]
    assert tuple(mask.shape) == (30, 20) and (mask[:5] == 1).all() and (mask[5:] == 0).all()


# -- 5. every bad file named in one run ---------------------------------------------------------------------------
def test_five_different_bad_files_are_named_in_one_run(train, capsys, tmp_path):
    root = _photos(str(tmp_path / "d"), n=10, classes="background\nred\nblue\n")
    images, masks = os.path.join(root, "images"), os.path.join(root, "masks")
    bad = {"truncated": truncate(os.path.join(images, "0001.jpg"), 0.5),
           "size": os.path.join(masks, "0002.png"), "values": os.path.join(masks, "0003.png"),
           "jpeg": os.path.join(masks, "0004.jpg"), "unpaired": os.path.join(images, "0010.jpg"),
           "unreadable": os.path.join(masks, "0005.png")}
    Image.fromarray(np.zeros((10, 32), np.uint8)).save(bad["size"])
    Image.fromarray(np.full((24, 32), 7, np.uint8)).save(bad["values"])
    os.remove(os.path.join(masks, "0004.png"))
    Image.fromarray(np.zeros((24, 32), np.uint8)).save(bad["jpeg"])
    Image.fromarray(photo(32, 24, 10)).save(bad["unpaired"])
    with open(bad["unreadable"], "wb") as f:
        f.write(b"\x89PNG not really")
    line = _refused(train, capsys, root, tmp_path / "runs")
    assert line.count(" bad files") == 1 and "6 bad files" in line
    for path in bad.values():
        assert os.path.relpath(path, root) in line, path
    for words in ("without its image or mask", "unreadable or truncated", "lossy masks (JPEG", "mask size differs",
                  "values of no class"):
        assert words in line


def test_many_bad_files_are_listed_in_a_file_of_the_temp_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    root = _photos(str(tmp_path / "d"), n=8)
    for i in range(5):
        truncate(os.path.join(root, "images", f"{i:04d}.jpg"), 0.4)
    with pytest.raises(DatasetError) as err:
        FolderSegmentation(root)
    message = str(err.value)
    assert "\n" not in message and "5 unreadable or truncated: " in message and ", ..." in message
    listing = message.rsplit("every bad file is listed in ", 1)[1]
    assert listing.startswith(str(tmp_path / "tmp"))
    rows = open(listing, encoding="utf-8").read().splitlines()[1:]
    assert sorted(r.split("\t")[1] for r in rows) == [f"images/{i:04d}.jpg" for i in range(5)]


# -- 6. classes without pixels -----------------------------------------------------------------------------------
def test_a_class_without_pixels_is_warned_of_in_the_run_output(train, capsys, tmp_path):
    root = _photos(str(tmp_path / "d"), classes="background\nred\nblue\nboat\n")
    data = FolderSegmentation(root)
    assert data.scan.warnings == ["class 'boat' (value 3) has no pixels in any of the 6 masks"]
    status = train.cli(["--dataset", "folder", "--data-root", root, "--output-dir", str(tmp_path / "runs"), *TINY])
    assert status == 0 and "warning: class 'boat' (value 3) has no pixels in any of the 6 masks" in \
        capsys.readouterr().out
    split = make_folder(str(tmp_path / "s"), "splitdirs", n_train=4, n_val=2, classes="classes: [bg, red, blue]\n")
    for name in os.listdir(os.path.join(split, "train", "masks")):  # class 2 only in val
        path = os.path.join(split, "train", "masks", name)
        values = np.array(Image.open(path))
        Image.fromarray(np.where(values == 2, 1, values).astype(np.uint8)).save(path)
    warnings = FolderSegmentation(split).scan.warnings
    assert warnings == ["class 'blue' (value 2) has no pixels in the training split (4 masks): the network cannot "
                        "learn it"]


# -- 7. mixed binary masks ---------------------------------------------------------------------------------------
def _mixed(i, h, w):
    m = np.zeros((h, w), np.uint8)
    m[4:16, 4:20] = 1 if i % 2 else 255
    return m


def test_mixed_0_1_and_0_255_masks_are_refused_with_binary_and_warned_of_without(train, capsys, tmp_path):
    root = _photos(str(tmp_path / "d"), mask=_mixed)
    line = _refused(train, capsys, root, tmp_path / "runs", "--binary")
    assert "--binary: 3 masks hold 0/1 (e.g. masks/0001.png) and 3 hold only 0/255 (e.g. masks/0000.png)" in line
    assert "are ignored, not foreground" in line
    warnings = FolderSegmentation(root).scan.warnings
    assert len(warnings) == 1 and warnings[0].startswith("3 masks hold 0/1")


def _bordered(i, h, w):
    """0/1 masks with 255 (ignore) on their borders; every third has no object: 0 and 255 only."""
    m = np.full((h, w), 255, np.uint8)
    m[1:-1, 1:-1] = 0
    m[4:16, 4:20] = 1 if i % 3 else 0
    return m


def test_0_1_masks_whose_ignore_value_is_255_are_not_a_mix(train, capsys, tmp_path):
    """255 in the 0/1 masks themselves is their ignore value: a mask of 0 and 255 is one without the object."""
    root = _photos(str(tmp_path / "d"), mask=_bordered)
    data = FolderSegmentation(root, binary=True)
    assert data.scan.warnings == [] and not data.scan.binary_255
    assert dataset_metadata(data)["ignore_index"] == 255
    assert not [w for w in FolderSegmentation(root).scan.warnings if "0/255" in w]


# -- 8. a small file, a huge mask: bounded memory ------------------------------------------------------------------
@pytest.fixture(scope="module")
def huge_mask(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("huge") / "mask.png")
    values = np.zeros((13000, 13000), np.uint8)
    values[::100] = 1
    Image.fromarray(values).save(path)
    return path


_PEAK = ("import resource, sys\n"
         "from encoding.datasets.folder_meta import mask_histogram\n"
         "from encoding.utils.images import set_max_pixels\n"
         "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
         "if len(sys.argv) > 2: set_max_pixels(int(sys.argv[2]))\n"
         "try:\n"
         "    h = mask_histogram(sys.argv[1]); print(h['values'], h['counts'])\n"
         "except Exception as err: print('refused', err)\n"
         "print('grew', (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n")


def test_a_13000_square_mask_is_refused_from_its_header_or_counted_in_bounded_memory(huge_mask):
    assert os.path.getsize(huge_mask) < 1 << 20  # a small file
    out = subprocess.run([sys.executable, "-c", _PEAK, huge_mask], capture_output=True, text=True, env=ENV)
    assert "refused" in out.stdout and "169,000,000 pixels is over the limit" in out.stdout, out.stderr
    assert int(out.stdout.split("grew ")[1]) < 64 << 20
    out = subprocess.run([sys.executable, "-c", _PEAK, huge_mask, "200000000"], capture_output=True, text=True,
                         env=ENV)
    assert f"[0, 1] [{169_000_000 - 130 * 13000}, {130 * 13000}]" in out.stdout, out.stderr
    grew = int(out.stdout.split("grew ")[1])
    assert grew < 400 << 20, grew  # the decoded bytes (161 MiB) and pieces; an int64 copy alone is 1.3 GiB


def test_the_scan_names_an_image_over_the_pixel_limit(tmp_path, monkeypatch):
    root = _photos(str(tmp_path / "d"), n=4, size=(40, 30))
    monkeypatch.setenv("ENCODING_MAX_PIXELS", "1000")
    with pytest.raises(DatasetError) as err:
        FolderSegmentation(root)
    assert "4 over the pixel limit (raise it with --max-pixels" in str(err.value)
    assert "images/0000.jpg (image of 40 x 30 = 1,200 pixels is over the limit of 1,000 pixels)" in str(err.value)
    monkeypatch.setenv("ENCODING_MAX_PIXELS", "1200")
    assert FolderSegmentation(root).scan.samples == 4
    monkeypatch.setenv("ENCODING_MAX_PIXELS", "1000")  # the records are cached now: the limit still holds
    with pytest.raises(DatasetError, match="4 over the pixel limit"):
        FolderSegmentation(root)


# -- 9. file names with spaces, unicode and newlines ----------------------------------------------------------------
def test_names_with_spaces_and_newlines_survive_the_hold_out_list(tmp_path):
    root = str(tmp_path / "d")
    _photos(root, n=6)
    names = ["IMG 0001", "photo été", "two\nlines", "tab\there", "  lead", "0005"]
    for i, stem in enumerate(names):
        os.rename(os.path.join(root, "images", f"{i:04d}.jpg"), os.path.join(root, "images", stem + ".jpg"))
        os.rename(os.path.join(root, "masks", f"{i:04d}.png"), os.path.join(root, "masks", stem + ".png"))
    first = FolderSegmentation(root, split="val", val_fraction=0.5, holdout_seed=3)
    listing = str(tmp_path / "run" / "holdout.json")
    os.makedirs(os.path.dirname(listing))
    first.save_holdout(listing)
    assert sorted(json.load(open(listing, encoding="utf-8"))["images"]) == sorted(first.holdout)
    again = FolderSegmentation(root, split="val", holdout_seed=9, holdout_file=listing)
    assert again.images == first.images and len(again) == 3
    legacy = str(tmp_path / "holdout.txt")  # an earlier run's list: one whole line per name
    with open(legacy, "w", encoding="utf-8") as f:
        f.write("# the hold-out\nimages/IMG 0001.jpg\nimages/photo été.jpg\n")
    old = FolderSegmentation(root, split="val", holdout_file=legacy)
    assert [os.path.basename(p) for p in old.images] == ["IMG 0001.jpg", "photo été.jpg"]


def test_a_bad_file_with_a_newline_in_its_name_is_reported_on_one_line(tmp_path):
    root = _photos(str(tmp_path / "d"), n=4)
    for i, stem in ((1, "a\nb"), (2, "c\nd")):
        os.rename(os.path.join(root, "images", f"{i:04d}.jpg"), os.path.join(root, "images", stem + ".jpg"))
        truncate(os.path.join(root, "images", stem + ".jpg"), 0.5)
        os.rename(os.path.join(root, "masks", f"{i:04d}.png"), os.path.join(root, "masks", stem + ".png"))
    with pytest.raises(DatasetError) as err:
        FolderSegmentation(root)
    assert "\n" not in str(err.value) and '"images/a\\nb.jpg"' in str(err.value)


def test_split_lists_take_names_with_spaces(tmp_path):
    root = _photos(str(tmp_path / "d"), n=4)
    for i in range(4):
        os.rename(os.path.join(root, "images", f"{i:04d}.jpg"), os.path.join(root, "images", f"IMG {i}.jpg"))
        os.rename(os.path.join(root, "masks", f"{i:04d}.png"), os.path.join(root, "masks", f"IMG {i}.png"))
    os.makedirs(os.path.join(root, "splits"))
    with open(os.path.join(root, "splits", "train.txt"), "w", encoding="utf-8") as f:
        f.write("IMG 0\nimages/IMG 1.jpg masks/IMG 1.png\n")
    with open(os.path.join(root, "splits", "val.txt"), "w", encoding="utf-8") as f:
        f.write("images/IMG 2.jpg\tmasks/IMG 2.png\nimages/IMG 3.jpg\n")
    train_set, val_set = FolderSegmentation(root), FolderSegmentation(root, split="val")
    assert [os.path.basename(p) for p in train_set.images + val_set.images] == [f"IMG {i}.jpg" for i in range(4)]


def test_a_list_entry_naming_another_extension_is_refused_in_one_line(tmp_path):
    """``0001.png`` listed as ``0001.jpg`` was matched by its stem and taken silently: an entry with an extension
    names that file (refused, naming the list, the line and the file that exists); a stem alone still pairs."""
    root = _photos(str(tmp_path / "d"), n=3)
    os.rename(os.path.join(root, "images", "0001.jpg"), os.path.join(root, "images", "0001.png"))
    os.makedirs(os.path.join(root, "splits"))
    listed = os.path.join(root, "splits", "train.txt")
    for text in ("0000\n# the photo\n0001.jpg\n", "0000.jpg\nimages/0001.jpg\n0002\n"):
        with open(listed, "w", encoding="utf-8") as f:
            f.write(text)
        with pytest.raises(DatasetError) as err:
            FolderSegmentation(root)
        line = 3 if text.startswith("0000\n") else 2
        assert str(err.value).splitlines() == [
            f"{listed}: line {line} lists {text.splitlines()[line - 1]!r}, which does not exist; the image of that "
            f"stem is {os.path.join('images', '0001.png')!r}: list that file, or the stem alone"]
    with open(listed, "w", encoding="utf-8") as f:
        f.write("0000.JPG\n0001\nimages/0001.png\n0002.jpg\n")  # the case of an extension is not a format
    names = [os.path.basename(image) for image, _ in read_pair_list(root, listed)]
    assert names == ["0000.jpg", "0001.png", "0001.png", "0002.jpg"]


# -- 10. hostile or unusual class files --------------------------------------------------------------------------
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + \
    "classes: *i\n"


@pytest.mark.parametrize("name, content, message", [
    ("classes.yaml", LAUGHS, "cannot parse (line 2: YAML aliases (*a) are not allowed in a class file)"),
    ("classes.txt", "".join(f"c{i}\n" for i in range(100000)) + "c7\n", "classes: at most 254"),
    ("classes.txt", "".join(f"c{i}\n" for i in range(200)) + "c7\n", "class names repeat: ['c7']"),
    ("classes.txt", "background\ncaf\xe9\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 14): save it"),
    ("classes.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is a binary file, not a class file"),
    ("classes.yaml", "classes: [bg, fg]\nignore_index: true\n", "ignore_index True must be an integer in [2, 255]"),
    ("classes.yaml", "classes: [bg, no]\n", "class name False is not text (quote it"),
    ("classes.json", '{"classes": ["bg", "fg"], "colors": [[0, 0, 0], [true, 0, 0]]}', "is not an (r, g, b)"),
    ("classes.txt", "x" * (2 << 20), "over 1,048,576 bytes"),
])
def test_hostile_class_files_are_one_line(train, capsys, tmp_path, name, content, message):
    import time
    root = _photos(str(tmp_path / "d"), n=4)
    with open(os.path.join(root, name), "wb") as f:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)
    started = time.perf_counter()
    with pytest.raises(DatasetError) as err:
        FolderSegmentation(root)
    assert time.perf_counter() - started < 5 and message in str(err.value) and "\n" not in str(err.value)
    assert err.value.path == os.path.join(root, name)
    if name == "classes.yaml" and "laughs" not in message:
        assert message in _refused(train, capsys, root, tmp_path / "runs")


# -- 11. a 16-bit value past 255: the scan and the loader agree ------------------------------------------------------
def test_a_16_bit_mask_value_300_is_ignored_by_the_scan_and_the_loader_alike(tmp_path):
    root = _photos(str(tmp_path / "d"), n=4, classes="background\nred\nblue\n")
    path = os.path.join(root, "masks", "0002.png")
    values = np.zeros((24, 32), np.uint16)
    values[:, :10] = 300
    values[:, 10:12] = 2
    Image.fromarray(values).save(path)
    assert Image.open(path).mode.startswith("I")
    with pytest.raises(DatasetError, match=r"label values \[300\] are outside the 3 classes"):
        FolderSegmentation(root)
    data = FolderSegmentation(root, unknown_labels="ignore", split="train", mode="testval", val_fraction=0.25)
    assert data.scan.unknown == 240 and data.scan.unknown_files == 1
    everything = FolderSegmentation(root, unknown_labels="ignore", split="val", mode="testval", val_fraction=0.25)
    for dataset in (data, everything):
        if path in dataset.masks:
            mask = dataset[dataset.masks.index(path)][1]
            assert (mask[:, :10] == -1).all() and (mask[:, 10:12] == 2).all() and (mask[:, 12:] == 0).all()
            break
    else:
        raise AssertionError("the 16-bit mask is in neither split")


def test_masks_of_no_class_pixel_at_all_are_refused_even_with_unknown_labels_ignored(tmp_path):
    """Every value outside the classes and ignored: nothing to learn or to score, refused naming the shares."""
    root = _photos(str(tmp_path / "d"), n=4, classes="background\nred\n",
                   mask=lambda i, h, w: np.full((h, w), 7 + i, np.uint8))
    with pytest.raises(DatasetError, match=r"no mask pixel is of a class: 100\.0 % hold values outside the classes"):
        FolderSegmentation(root, unknown_labels="ignore")


# -- pairing: the mask suffixes people use -------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", ["_mask", "_label", "_gt", "-seg"])
def test_masks_named_with_a_shared_suffix_pair_with_their_images(tmp_path, suffix):
    root = _photos(str(tmp_path / "d"), n=4)
    for i in range(4):
        os.rename(os.path.join(root, "masks", f"{i:04d}.png"), os.path.join(root, "masks", f"{i:04d}{suffix}.png"))
    data = FolderSegmentation(root, split="train", val_fraction=0.25, holdout_seed=0)  # the draw holds 0002 out
    assert [os.path.basename(m) for m in data.masks] == [f"{i:04d}{suffix}.png" for i in (0, 1, 3)]
    assert [os.path.basename(m) for m in data.images] == [f"{i:04d}.jpg" for i in (0, 1, 3)]


def test_masks_that_pair_with_nothing_point_to_split_lists(tmp_path):
    root = _photos(str(tmp_path / "d"), n=3)
    for i, name in enumerate(("a_mask", "b_label", "c")):
        os.rename(os.path.join(root, "masks", f"{i:04d}.png"), os.path.join(root, "masks", name + ".png"))
    with pytest.raises(DatasetError) as err:
        FolderSegmentation(root)
    assert "no mask name matches an image name" in str(err.value) and "use splits/*.txt listing the pairs, one " \
           "'images/0000.jpg<TAB>masks/a_mask.png' per line" in str(err.value)


# -- grey and 16-bit photos, the scan on its own ---------------------------------------------------------------------
def test_the_scan_alone_prints_the_summary_and_the_class_table_and_writes_nothing(tmp_path, capsys):
    root = _photos(str(tmp_path / "d"), n=4, classes="background\nred\nblue\n")
    Image.fromarray(photo(32, 24, 1)[..., 0]).save(os.path.join(root, "images", "0001.jpg"))  # grey JPEG
    Image.fromarray(photo(32, 24, 2)[..., 0].astype(np.uint16) * 257).save(os.path.join(root, "images", "0002.png"))
    os.remove(os.path.join(root, "images", "0002.jpg"))  # a 16-bit PNG photo instead
    before = tree(root)
    out = subprocess.run([sys.executable, "-m", "encoding.datasets.scan", root], capture_output=True, text=True,
                         env=ENV, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "images + masks layout, train 3, val 1 (val: a hold-out" in lines[0]
    assert lines[1].startswith("scanned 4 image/mask pairs, 3 classes: background ")
    assert lines[3].split() == ["value", "class", "pixels", "masks"]
    assert lines[5].split()[:2] == ["1", "red"] and lines[5].split()[-1] == "50.0%"
    assert lines[7].split()[:2] == ["255", "(ignored)"] and tree(root) == before
    truncate(os.path.join(root, "images", "0003.jpg"))
    before = tree(root)
    from encoding.datasets.scan.__main__ import cli

    status, err = cli([root]), capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1 and "0003.jpg" in err
    assert "cannot decode image" in err and tree(root) == before


# -- a read-only data root, a relative --data-root ---------------------------------------------------------------------
def test_a_read_only_data_root_trains_and_is_left_as_it_was(train, tmp_path):
    root = _photos(str(tmp_path / "d"), n=6)
    before = tree(root)
    modes = {}
    for base, dirs, files in os.walk(root):
        for name in [base] + [os.path.join(base, f) for f in files]:
            modes[name] = os.stat(name).st_mode
            os.chmod(name, modes[name] & ~0o222)
    try:
        status = train.cli(["--dataset", "folder", "--data-root", root, "--output-dir", str(tmp_path / "runs"), *TINY])
    finally:
        for name, mode in modes.items():
            os.chmod(name, mode)
    assert status == 0 and tree(root) == before  # as root chmod stops nothing: nothing new appeared either way
    run = tmp_path / "runs" / "folder" / "unet" / "default"
    assert (run / "holdout.json").is_file() and (run / "checkpoint.pth").is_file()


def test_a_relative_data_root_is_recorded_absolute_and_test_runs_from_another_folder(train, tmp_path, monkeypatch,
                                                                                    capsys):
    """A relative --data-root is recorded as an absolute path: test.py, started in another folder, finds the data."""
    import torch
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    _photos(str(work / "mydata"), n=6)
    os.makedirs(elsewhere)
    monkeypatch.chdir(work)
    assert train.cli(["--dataset", "folder", "--data-root", "mydata", "--output-dir", "runs", *TINY]) == 0
    ckpt = work / "runs" / "folder" / "unet" / "default" / "checkpoint.pth"
    args = torch.load(ckpt, weights_only=True)["args"]
    assert args["data_root"] == str(work / "mydata") and args["classes"] == ["class_0", "class_1", "class_2"]
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    status = load_script("test").cli(["--resume", str(ckpt), "--workers", "0", "--out-dir", "eval"])
    out = capsys.readouterr()
    assert status == 0 and "class_1" in out.out, out.err
    assert json.load(open(elsewhere / "eval" / "metrics.json"))
