"""A user's folder read as meant, round 2: masks whose encoding the first scan misread without a word. A thin 0/255
foreground with a two-class file, lossy masks that are not JPEG (WebP, JPEG-compressed TIFF, JPEG 2000), grey class
colours (CamVid's sky) in colour masks, an ignore colour that is a class colour, and a test run on data whose class
file is not the network's. Each case is built from real files and checks the scan and the loader alike."""
import collections
import os
import warnings

import numpy as np
import pytest
from PIL import Image

from conftest import load_script
from encoding.datasets import DatasetError, FolderSegmentation
from encoding.datasets.folder_meta import mask_histogram, read_mask
from folder_data import photo

TINY = ["--crop-size", "16", "--base-size", "24", "--batch-size", "4", "--workers", "0", "--epochs", "1"]


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _folder(root, masks, classes, ext=".png", save=None):
    """``root/images`` (JPEG photos) + ``root/masks`` (``masks``: arrays, saved with ``save(array, path)``, default
    ``Image.fromarray(array).save(path)``) + ``root/classes.yaml`` (``classes``: its text)."""
    for sub in ("images", "masks"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    for i, mask in enumerate(masks):
        h, w = mask.shape[:2]
        Image.fromarray(photo(w, h, i)).save(os.path.join(root, "images", f"{i:03d}.jpg"), quality=92)
        path = os.path.join(root, "masks", f"{i:03d}{ext}")
        (save or (lambda a, p: Image.fromarray(a).save(p)))(mask, path)
    with open(os.path.join(root, "classes.yaml"), "w", encoding="utf-8") as f:
        f.write(classes)
    return root


def _squares(n, rgb=False):
    """``n`` 32 x 32 index masks: a square of class ``1 + i % 2`` on background 0 (``rgb``: saved as grey RGB)."""
    masks = []
    for i in range(n):
        m = np.zeros((32, 32), np.uint8)
        m[8:20, 8:20] = 1 + i % 2
        masks.append(np.stack([m] * 3, axis=-1) if rgb else m)
    return masks


def _labels(*datasets):
    """Pixels per class id over every sample of ``datasets`` (as the loader gives them)."""
    counts = {}
    for data in datasets:
        for i in range(len(data)):
            values, n = np.unique(data[i][1].numpy(), return_counts=True)
            for v, c in zip(values.tolist(), n.tolist()):
                counts[v] = counts.get(v, 0) + c
    return counts


def _both_splits(root, **options):
    """The train and the held-out val split of the folder ``root``, as ``test.py`` reads them (whole masks)."""
    return [FolderSegmentation(root, split=split, mode="testval", **options) for split in ("train", "val")]


def test_a_thin_0_255_foreground_with_a_two_class_file_is_refused_however_few_its_pixels(tmp_path):
    """A crack two pixels wide (6 % of the pixels, in every mask) saved as 255: the ignore value, so the foreground
    would never be learnt. Refused with the --binary hint, which then reads it as foreground."""
    masks = []
    for _ in range(6):
        m = np.zeros((32, 32), np.uint8)
        m[:, 15:17] = 255
        masks.append(m)
    root = _folder(str(tmp_path / "d"), masks, "classes: [background, crack]\n")
    with pytest.raises(DatasetError, match=r"class 'crack' has no pixels while value 255 covers 6\.2 % of the mask "
                                           r"pixels \(the masks hold only 0 and 255\); did you mean --binary"):
        FolderSegmentation(root)
    assert _labels(*_both_splits(root, binary=True)) == {0: 6 * 30 * 32, 1: 6 * 64}  # the crack: foreground


def test_the_ignore_value_refusal_speaks_of_mask_pixels_and_a_rare_ignore_value_only_warns(tmp_path):
    """Three classes, one never drawn, 255 on a thin border: a warning (VOC-style borders with an unused class are
    legitimate), not a refusal; the share is of the mask pixels, as the table says."""
    masks = []
    for i in range(6):
        m = np.zeros((32, 32), np.uint8)
        m[8:20, 8:20] = 1
        m[0] = 255
        masks.append(m)
    root = _folder(str(tmp_path / "d"), masks, "classes: [background, car, boat]\n")
    data = FolderSegmentation(root)
    assert any("class 'boat' (value 2) has no pixels" in w for w in data.scan.warnings)
    assert data.scan.ignored == 6 * 32


@pytest.mark.parametrize("ext, save, lossy", [
    (".webp", lambda a, p: Image.fromarray(a).save(p, quality=30), True),
    (".webp", lambda a, p: Image.fromarray(a).save(p, lossless=True), False),
    (".tif", lambda a, p: Image.fromarray(a).save(p, compression="jpeg"), True),
    (".tif", lambda a, p: Image.fromarray(a).save(p, compression="tiff_lzw"), False),
    (".jp2", lambda a, p: Image.fromarray(a).save(p, quality_mode="rates", quality_layers=[40]), True),
])
def test_lossy_masks_are_refused_whatever_their_container(tmp_path, ext, save, lossy):
    """The lossy check reads how the file is compressed, not only its format's name: a lossy WebP turned {0, 2, 4}
    into values 0..6 at every edge; a lossless WebP or an LZW TIFF reads exactly."""
    masks = []
    for _ in range(6):
        m = np.zeros((32, 32), np.uint8)
        m[4:20, 4:20] = 4
        m[20:28, 10:30] = 2
        masks.append(m)
    root = _folder(str(tmp_path / "d"), masks, "classes: [a, b, c, d, e, f, g]\n", ext, save)
    if lossy:
        with pytest.raises(DatasetError, match="lossy masks .*masks must be PNG or another lossless format"):
            FolderSegmentation(root)
        assert mask_histogram(os.path.join(root, "masks", "000" + ext))["lossy"] or ext == ".jp2"
    else:
        assert set(_labels(*_both_splits(root))) == {0, 2, 4}


def test_grey_class_colours_are_read_as_their_class_by_the_scan_and_the_loader(tmp_path):
    """CamVid's sky is (128, 128, 128): a colour mask holding only sky and void is all grey, and was read as an index
    mask (value 128: refused, or with --unknown-labels ignore dropped). With the class file's colours it is sky."""
    masks = []
    for i in range(6):
        m = np.zeros((32, 32, 3), np.uint8)
        m[:10] = (128, 128, 128)
        if i % 2 == 0:
            m[16:24, 8:16] = (64, 0, 128)
        masks.append(m)
    classes = "classes: [void, sky, car]\ncolors: [[0, 0, 0], [128, 128, 128], [64, 0, 128]]\n"
    root = _folder(str(tmp_path / "d"), masks, classes)
    splits = _both_splits(root)
    assert splits[0].scan.pixels == [6 * 22 * 32 - 3 * 64, 6 * 10 * 32, 3 * 64] and not splits[0].scan.warnings
    assert _labels(*splits) == {0: 6 * 22 * 32 - 3 * 64, 1: 6 * 10 * 32, 2: 3 * 64}
    grey_only = os.path.join(root, "masks", "001.png")
    colors = splits[0]._colors
    assert read_mask(grey_only, colors)[0] == "color" and read_mask(grey_only)[0] == "index"


def test_grey_rgb_index_masks_without_class_colours_stay_index_masks(tmp_path):
    """An index mask saved as RGB (each pixel (v, v, v)) with no colours in the class file: values, as before."""
    root = _folder(str(tmp_path / "d"), _squares(6, rgb=True), "classes: [background, red, blue]\n")
    assert _labels(*_both_splits(root)) == {0: 6 * (1024 - 144), 1: 3 * 144, 2: 3 * 144}


def test_an_ignore_colour_that_is_a_class_colour_is_refused(tmp_path):
    masks = [np.full((32, 32, 3), (128, 64, 128), np.uint8) for _ in range(4)]
    classes = "classes: [road, sign]\ncolors: [[128, 64, 128], [255, 255, 255]]\nignore_color: [255, 255, 255]\n"
    root = _folder(str(tmp_path / "d"), masks, classes)
    with pytest.raises(DatasetError, match=r"ignore_color \[255, 255, 255\] is the colour of class 'sign': its "
                                           r"pixels would be ignored"):
        FolderSegmentation(root)


def test_test_py_refuses_data_whose_class_file_is_not_the_networks(tmp_path, capsys):
    """Trained on [bg, one, two]; evaluated on the same masks with the class file reordered [bg, two, one]: mask
    value 1 would be scored as 'one' although the data says 'two'. One line, exit status 2; the same data with the
    network's class file evaluates."""
    root = _folder(str(tmp_path / "d"), _squares(8), "classes: [bg, one, two]\n")
    train, test = load_script("train"), load_script("test")
    assert train.cli(["--dataset", "folder", "--data-root", root, "--output-dir", str(tmp_path / "runs"),
                      *TINY]) == 0
    ckpt = str(tmp_path / "runs" / "folder" / "unet" / "default" / "checkpoint.pth")
    with open(os.path.join(root, "classes.yaml"), "w", encoding="utf-8") as f:
        f.write("classes: [bg, two, one]\n")
    capsys.readouterr()
    assert test.cli(["--resume", ckpt, "--workers", "0", "--out-dir", str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "classes.yaml: the data's 3 classes are not the network's 3 (class 1: 'two' here, " \
                              "'one' in the network)" in err[0]
    assert not (tmp_path / "eval" / "metrics.json").exists()
    with open(os.path.join(root, "classes.yaml"), "w", encoding="utf-8") as f:
        f.write("classes: [bg, one, two]\n")
    assert test.cli(["--resume", ckpt, "--workers", "0", "--out-dir", str(tmp_path / "eval")]) == 0


def test_a_checkpoint_moved_from_its_hold_out_list_is_scored_on_the_same_hold_out(tmp_path, capsys):
    """Without the run's holdout.json beside the checkpoint, test.py drew a new hold-out with the defaults (seed 0,
    a tenth), which held training images; now it draws it again with the run's recorded seed and share: the
    images held out in training. test.py has no --seed (it was accepted and read nowhere)."""
    import json
    import shutil

    root = _folder(str(tmp_path / "d"), _squares(6), "classes: [bg, one, two]\n")
    train, test = load_script("train"), load_script("test")
    assert train.cli(["--dataset", "folder", "--data-root", root, "--output-dir", str(tmp_path / "runs"), *TINY,
                      "--val-fraction", "0.34", "--seed", "3"]) == 0
    run = tmp_path / "runs" / "folder" / "unet" / "default"
    held = sorted(os.path.splitext(os.path.basename(p))[0] for p in
                  json.loads((run / "holdout.json").read_text())["images"])
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.copy(run / "checkpoint.pth", moved / "checkpoint.pth")
    assert test.cli(["--resume", str(moved / "checkpoint.pth"), "--workers", "0", "--out-dir", str(tmp_path / "e"),
                     "--save-pred", str(tmp_path / "pred")]) == 0
    assert sorted(os.path.splitext(n)[0] for n in os.listdir(tmp_path / "pred") if n.endswith(".png")) == held
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        test.cli(["--resume", str(moved / "checkpoint.pth"), "--seed", "3"])
    assert stopped.value.code == 2 and "unrecognized arguments: --seed 3" in capsys.readouterr().err


def test_class_weights_on_a_users_folder_write_nothing_into_it(tmp_path):
    """--class-weights auto counted the labels and cached them in DIR/label_counts.json: the folder is the user's,
    never written. The counts go to the user's cache folder, and the second run reads them from there."""
    from encoding.datasets.class_weights import label_counts
    from folder_data import tree

    root = _folder(str(tmp_path / "d"), _squares(6), "classes: [bg, one, two]\n")
    before = tree(root)
    data = FolderSegmentation(root, split="train", mode="testval")
    first, again = label_counts(data, progress=False), label_counts(data, progress=False)
    assert tree(root) == before
    assert not first["cached"] and again["cached"] and again["pixels"] == first["pixels"]
    cached = os.listdir(tmp_path / "cache" / "encoding" / "label_counts")
    assert len(cached) == 1 and cached[0].endswith(".json")


def test_label_counts_of_masks_read_through_other_class_colours_are_counted_again(tmp_path):
    """The same colour masks under a corrected class file are other classes' pixels: the cached counts (keyed on
    the mask files) are not reused for them."""
    from encoding.datasets.class_weights import label_counts

    root = tmp_path / "colours"
    for split in ("train", "val"):
        for kind in ("images", "masks"):
            (root / split / kind).mkdir(parents=True)
        for i in range(2):
            rgb = np.zeros((20, 20, 3), np.uint8)
            rgb[:10], rgb[10:12] = (255, 0, 0), (0, 0, 255)  # 200 red and 40 blue pixels
            Image.fromarray(rgb).save(root / split / "masks" / f"{i}.png")
            Image.fromarray(photo(20, 20, i)).save(root / split / "images" / f"{i}.png")
    counted = []
    for colours in ("[[0, 0, 0], [0, 0, 255], [255, 0, 0]]", "[[0, 0, 0], [255, 0, 0], [0, 0, 255]]"):
        (root / "classes.yaml").write_text(f"classes: [background, car, road]\ncolors: {colours}\n")
        counted.append(label_counts(FolderSegmentation(str(root), split="train"), progress=False))
    assert [c["pixels"] for c in counted] == [[320, 80, 400], [320, 400, 80]]
    assert not counted[1]["cached"]


def test_a_colour_mask_converted_to_a_palette_image_is_warned_of(tmp_path):
    """A colour mask saved as a palette (P) image by an editor's colour reduction: its values are palette slots, so
    sky (slot 0) reads as background. P masks are read as class ids (as documented); where a value's palette colour
    is another class's colour in the class file, the run says so. A palette whose colours are the classes' (VOC's
    masks) says nothing."""
    classes = "classes: [background, person, sky]\ncolors: [[0, 0, 0], [220, 20, 60], [70, 130, 180]]\n"

    def converted(a, p):
        Image.fromarray(a).convert("P", palette=Image.Palette.ADAPTIVE, colors=4).save(p)

    masks = []
    for _ in range(6):
        m = np.zeros((32, 32, 3), np.uint8)
        m[:8] = (70, 130, 180)
        m[16:24, 8:16] = (220, 20, 60)
        masks.append(m)
    root = _folder(str(tmp_path / "converted"), masks, classes, save=converted)
    warnings = FolderSegmentation(root).scan.warnings
    assert len(warnings) == 1 and "6 palette mask(s) colour a value as another class" in warnings[0]
    assert "value 0 is read as 'background' but coloured as 'sky'" in warnings[0]

    def voc_style(a, p):  # class ids, with the class file's colours as the palette
        im = Image.fromarray(a)
        im.putpalette([0, 0, 0, 220, 20, 60, 70, 130, 180])
        im.save(p)

    ids = []
    for _ in range(6):
        m = np.zeros((32, 32), np.uint8)
        m[:8], m[16:24, 8:16] = 2, 1
        ids.append(m)
    assert FolderSegmentation(_folder(str(tmp_path / "voc"), ids, classes, save=voc_style)).scan.warnings == []


def test_a_val_list_sharing_images_with_the_train_list_is_refused(tmp_path):
    """splits/val.txt listing an image of splits/train.txt: validation would score images the network trained on."""
    from folder_data import make_folder

    root = make_folder(str(tmp_path / "d"), "lists")
    with open(os.path.join(root, "splits", "val.txt"), "a") as f:
        f.write("img00\n")
    with pytest.raises(DatasetError, match=r"val\.txt: lists 1 image\(s\) that train\.txt lists too \(e\.g\. "
                                           r"images/img00\.jpg\)"):
        FolderSegmentation(root, split="val")


def test_a_list_naming_an_image_twice_is_refused_for_scores_and_warned_of_for_training(tmp_path):
    """A val list naming an image twice (once by stem, once by its paths) would count it twice in the scores: refused,
    naming the entries. A training list may repeat an image on purpose: warned of, and trained on that many times."""
    from folder_data import make_folder

    root = make_folder(str(tmp_path / "d"), "lists")
    val = os.path.join(root, "splits", "val.txt")
    with open(val, "a") as f:
        f.write("# a comment\nimg06\n")
    with pytest.raises(DatasetError, match=r"val\.txt: lists 1 image\(s\) again \(e\.g\. images/img06\.jpg, "
                                           r"entries 1 and 3\): its scores would count each as many times"):
        FolderSegmentation(root, split="val")
    with open(val, "w") as f:
        f.write("img06\nimg07\n")
    with open(os.path.join(root, "splits", "train.txt"), "a") as f:
        f.write("img00\nimg00\n")
    with pytest.warns(RuntimeWarning, match=r"train\.txt: lists 2 image\(s\) again \(e\.g\. images/img00\.jpg, "
                                            r"entries 1 and 7\): each is trained on as many times an epoch"):
        train = FolderSegmentation(root, split="train")
    with pytest.warns(RuntimeWarning, match="train.txt"):  # the lists are read together
        val = FolderSegmentation(root, split="val")
    assert len(train) == 8 and len(val) == 2
    os.remove(os.path.join(root, "splits", "val.txt"))  # a hold-out drawn from the list: the repeats stay repeated
    listed = collections.Counter(train.images)
    for seed in range(4):
        with pytest.warns(RuntimeWarning, match="train.txt"):
            train, val = (FolderSegmentation(root, split=s, holdout_seed=seed) for s in ("train", "val"))
        assert len(set(val.images)) == len(val.images) == 1
        assert collections.Counter(train.images) == {k: n for k, n in listed.items() if k not in val.images}


def test_a_published_split_list_naming_a_sample_twice_is_warned_of(tmp_path):
    from encoding.datasets.layout import read_split_file

    path = tmp_path / "val.txt"
    path.write_text("2007_000033\n2007_000042 extra\n\n# note\n2007_000033\n")
    with pytest.warns(RuntimeWarning, match=r"val\.txt: lists 1 sample id\(s\) more than once \(e\.g\. "
                                            r"'2007_000033'\): each counts as many times"):
        assert read_split_file(str(path)) == ["2007_000033", "2007_000042", "2007_000033"]


def test_an_rgba_mask_with_transparent_pixels_is_refused(tmp_path):
    """An editor's layer: one brush colour, transparent elsewhere, where it keeps the brush colour too. Read as RGB
    it was that class everywhere; a transparent pixel's colour means nothing: refused, naming the file. An opaque
    RGBA mask reads as its colours."""
    classes = "classes: [background, road]\ncolors: [[0, 0, 0], [128, 64, 128]]\n"

    def layer(a, p):
        rgba = np.zeros(a.shape[:2] + (4,), np.uint8)
        rgba[..., :3] = (128, 64, 128)
        rgba[..., 3] = np.where(a[..., 0] > 0, 255, 0)
        Image.fromarray(rgba, "RGBA").save(p)

    masks = []
    for _ in range(4):
        m = np.zeros((32, 32, 3), np.uint8)
        m[10:20] = (128, 64, 128)
        masks.append(m)
    root = _folder(str(tmp_path / "layer"), masks, classes, save=layer)
    with pytest.raises(DatasetError, match=r"4 masks with transparent pixels \(their colour is no label: flatten"):
        FolderSegmentation(root)
    opaque = _folder(str(tmp_path / "opaque"), masks, classes,
                     save=lambda a, p: Image.fromarray(np.dstack([a, np.full(a.shape[:2], 255, np.uint8)]),
                                                       "RGBA").save(p))
    assert FolderSegmentation(opaque).scan.pixels == [4 * 22 * 32, 4 * 10 * 32]


def test_a_trainval_list_is_a_split_to_train_on_and_validating_inside_it_is_warned_of(tmp_path):
    """VOC's splits/trainval.txt holds val.txt by design: a list to train on, not refused as sharing images with
    train.txt. A run training on it and validating on val is warned of; an unknown split names the folder's."""
    from folder_data import make_folder

    root = make_folder(str(tmp_path / "d"), "lists")
    lists = os.path.join(root, "splits")
    text = "".join(open(os.path.join(lists, f"{n}.txt")).read() for n in ("train", "val"))
    with open(os.path.join(lists, "trainval.txt"), "w") as f:
        f.write(text)
    data = FolderSegmentation(root, split="trainval")
    assert data.SPLITS == ("train", "trainval", "val") and len(data) == 8
    with pytest.raises(DatasetError, match=r"unknown split 'nope'; valid splits: train, trainval, val"):
        FolderSegmentation(root, split="nope")
    train = load_script("train")
    run = ["--dataset", "folder", "--data-root", root, *TINY]
    with pytest.warns(RuntimeWarning, match=r"the 'val' split shares 2 of its 2 images with the 'trainval' split it "
                                            r"trains on"):
        assert train.cli(run + ["--train-split", "trainval", "--output-dir", str(tmp_path / "a")]) == 0
    with warnings.catch_warnings():  # --no-val scores nothing: nothing to warn of
        warnings.filterwarnings("error", message=".*shares")
        assert train.cli(run + ["--train-split", "trainval", "--no-val", "--output-dir", str(tmp_path / "n")]) == 0
    from encoding.engine.builders import build_loaders  # the public builder warns as train.py does
    with pytest.warns(RuntimeWarning, match=r"the 'val' split shares 2 of its 2 images"):
        build_loaders("folder", batch_size=2, root=root, train_split="trainval", workers=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*shares")
        assert train.cli(run + ["--output-dir", str(tmp_path / "b")]) == 0
    assert train.cli(run + ["--train-split", "nope", "--output-dir", str(tmp_path / "c")]) == 2
    assert not os.path.exists(tmp_path / "c")


def test_a_dataset_of_one_class_is_refused_before_anything_is_written(tmp_path, capsys):
    """One class (a class file naming only the background): every pixel scored 100 % and the saved predictions were
    thresholded as a binary network's. Refused in one line; --binary is the way to a class against the rest."""
    from folder_data import make_folder

    root = make_folder(str(tmp_path / "d"), "flat")
    with open(os.path.join(root, "classes.yaml"), "w") as f:
        f.write("classes: [background]\n")
    out = tmp_path / "runs"
    assert load_script("train").cli(["--dataset", "folder", "--data-root", root, "--output-dir", str(out), *TINY,
                                     "--unknown-labels", "ignore"]) == 2
    assert "--dataset folder: 1 class (background): nothing to tell apart" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("layout, val", [("splitdirs", "valid"), ("mmseg", "validation"), ("lists", "valid"),
                                         ("nested", "val")])
def test_a_validation_split_under_another_name_or_nested_in_images_validates(tmp_path, layout, val):
    """A val split named ``valid`` / ``validation`` (Roboflow's, ADE20K's), or ``images/{train,val}`` +
    ``masks/{train,val}``: it was silently passed over (or pooled with train) and a hold-out of 1 training image
    validated. It is the val split; two names of one split are refused; a stray image beside the split folders too."""
    from folder_data import write_pair

    j, root = os.path.join, str(tmp_path / "d")
    for i in range(8):
        split = "train" if i < 6 else val
        if layout == "splitdirs":
            write_pair(j(root, split, "images"), j(root, split, "masks"), f"img{i}", i)
        elif layout == "mmseg":
            write_pair(j(root, "img_dir", split), j(root, "ann_dir", split), f"img{i}", i)
        elif layout == "nested":
            write_pair(j(root, "images", split), j(root, "masks", split), f"img{i}", i)
        else:
            write_pair(j(root, "images"), j(root, "masks"), f"img{i}", i)
    if layout == "lists":
        os.makedirs(j(root, "splits"))
        for name, ids in (("train", range(6)), (val, range(6, 8))):
            with open(j(root, "splits", name + ".txt"), "w") as f:
                f.write("".join(f"img{i}\n" for i in ids))
    train, test = (FolderSegmentation(root, split=s, mode="testval") for s in ("train", "val"))
    assert sorted(os.path.basename(p) for p in test.images) == ["img6.jpg", "img7.jpg"]
    assert len(train) == 6 and test.holdout is None and set(test.SPLITS) == {"train", "val"}
    if layout == "splitdirs":  # val/ beside valid/: which one validates would be a guess
        write_pair(j(root, "val", "images"), j(root, "val", "masks"), "img9", 9)
        with pytest.raises(DatasetError, match=r"valid: is split 'val' as 'val' is: keep one"):
            FolderSegmentation(root, split="val")
    if layout == "nested":
        write_pair(j(root, "images"), j(root, "masks"), "loose", 1)
        with pytest.raises(DatasetError, match=r"images/loose\.jpg: is outside the split folders of .*images "
                                               r"\(train, val\): move it into one of them"):
            FolderSegmentation(root, split="val")


@pytest.mark.parametrize("text, names", [("0 background\n2 dog\n1 cat\n", ("background", "cat", "dog")),
                                         ("0: background 0 0 0\n1: cat 255 0 0\n2: dog 0 0 255\n",
                                          ("background", "cat", "dog")),
                                         ("background\ncat\ndog\n", ("background", "cat", "dog")),
                                         ("1 cat\n2 dog\n3 bird\n", None)])
def test_a_classes_txt_numbering_its_classes_names_each_mask_value_by_its_number(tmp_path, text, names):
    """A classes.txt of ``id name`` lines (a common label-map file) was read as names ``'0 background'``, ``'2 dog'``
    in line order: value 1 was named "2 dog". The ids now order the names; ids that are not 0..n-1 (1-based ones) are
    refused in one line naming the file."""
    from folder_data import make_folder

    root = make_folder(str(tmp_path / "d"), "flat")
    with open(os.path.join(root, "classes.txt"), "w") as f:
        f.write(text)
    if names is None:
        with pytest.raises(DatasetError, match=r"classes\.txt: numbers its classes \[1, 2, 3\]: the numbers must be "
                                               r"the mask values 0\.\.2, each once"):
            FolderSegmentation(root)
        return
    data = FolderSegmentation(root)
    assert data.CLASSES == names
    if "255 0 0" in text:
        assert data.PALETTE == ((0, 0, 0), (255, 0, 0), (0, 0, 255))
