"""Folder datasets (``--dataset folder --data-root DIR``): the four layouts train with no code; classes, colours and
the ignore value travel in the checkpoint to test.py, demo.py, load_model + segment; each bad-data case is one line
naming the file, exit status 2, no run directory; the scan is cached; the hold-out is kept; binary runs report the
foreground IoU; user dataset classes keep their sizes and are found from the checkpoint alone."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import encoding
from conftest import ROOT, load_script
from encoding.datasets import FolderSegmentation, get_segmentation_dataset
from encoding.datasets.folder import HOLDOUT_SEED
from encoding.datasets import scan as scan_module
from encoding.datasets import DatasetError
from encoding.engine.assemble import ConfigError
from encoding.inference.evaluation import PredictionWriter, prediction_filename
from folder_data import COLORS, make_folder

TINY = ["--crop-size", "16", "--base-size", "24", "--batch-size", "4", "--workers", "0", "--epochs", "1"]
CLASSES_YAML = ("classes:\n - {name: bg, color: [0, 0, 0]}\n - {name: red, color: [255, 0, 0]}\n"
                " - {name: blue, color: [0, 0, 255]}\nignore_index: 255\nignore_color: [255, 255, 255]\n")


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    """The scan cache of these tests lives in their temporary folder, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def scripts():
    return {name: load_script(name) for name in ("train", "test", "demo")}


def _train(scripts, root, out, *extra):
    return scripts["train"].main(["--dataset", "folder", "--data-root", str(root), "--output-dir", str(out),
                                  *TINY, *extra])


@pytest.mark.parametrize("layout", ["flat", "splitdirs", "mmseg", "lists"])
def test_every_layout_trains_and_the_checkpoint_carries_the_classes(layout, scripts, tmp_path, capsys):
    root = make_folder(str(tmp_path / "data"), layout, classes=CLASSES_YAML if layout != "flat" else None)
    result = _train(scripts, root, tmp_path / "runs")
    out = capsys.readouterr().out
    assert "scanned 8 image/mask pairs, 3 classes" in out and "on folder" in out
    run = tmp_path / "runs" / "folder" / "unet" / "default"
    names = ("bg", "red", "blue") if layout != "flat" else ("class_0", "class_1", "class_2")
    assert set(result["IoU"].shape) == {3}
    assert (run / "holdout.json").is_file() == (layout == "flat")  # only the unsplit layout holds out
    model = encoding.load_model(str(run / "checkpoint.pth"))
    assert model.info.classes == names and model.info.ignore_index == 255
    palette = tuple(map(tuple, COLORS)) if layout != "flat" else ((0, 0, 0), (128, 0, 0), (0, 128, 0))
    assert model.info.palette == palette
    labels = encoding.segment(model, os.path.join(root, *(("images",) if layout in ("flat", "lists") else
                                                         ("train", "images") if layout == "splitdirs" else
                                                         ("img_dir", "train")), "img00.jpg"))
    assert labels.shape == (20, 24) and int(labels.max()) < 3


def test_test_and_demo_use_the_checkpoint_classes_and_colours(scripts, tmp_path, capsys):
    root = make_folder(str(tmp_path / "data"), "splitdirs", encoding="color", classes=CLASSES_YAML)
    _train(scripts, root, tmp_path / "runs")
    ckpt = str(tmp_path / "runs" / "folder" / "unet" / "default" / "checkpoint.pth")
    capsys.readouterr()
    scripts["test"].main(["--resume", ckpt, "--workers", "0", "--out-dir", str(tmp_path / "eval")])
    table = capsys.readouterr().out
    assert all(name in table for name in ("bg", "red", "blue"))  # the data root came from the checkpoint too
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert "red" in json.dumps(report)
    scripts["demo"].main(["--resume", ckpt, "--out-dir", str(tmp_path / "demo"),
                          os.path.join(root, "val", "images", "img06.jpg")])
    masks = [f for f in os.listdir(tmp_path / "demo") if f.endswith(".png") and "overlay" not in f]
    mask = Image.open(tmp_path / "demo" / masks[0])
    assert mask.mode == "P" and mask.getpalette()[:9] == [v for c in COLORS for v in c]


def test_mask_encodings_and_class_files(tmp_path):
    for encoding_, classes in (("color", CLASSES_YAML), ("palette", None), ("index", None)):
        root = make_folder(str(tmp_path / encoding_), "splitdirs", encoding=encoding_, classes=classes)
        data = get_segmentation_dataset("folder", root=root, split="val", mode="testval")
        _, mask = data[0]
        expected = np.array(Image.open(os.path.join(root, "val", "images", "img06.jpg")).size[::-1])
        assert tuple(mask.shape) == tuple(expected)
        assert sorted(mask.unique().tolist()) == [-1, 0, 1]  # border ignored, square class 1 on background
    txt = tmp_path / "txt"
    make_folder(str(txt), "flat")
    (txt / "classes.txt").write_text("# name r g b\nsky 0 0 0\nroad 10 20 30\ncar\n")
    with pytest.raises(DatasetError, match="gives 2 colours for 3 classes"):
        FolderSegmentation(str(txt))
    (txt / "classes.txt").write_text("sky\nroad\ncar\n")
    assert FolderSegmentation(str(txt)).CLASSES == ("sky", "road", "car")


def test_binary_masks_and_the_binary_run_report_foreground_scores(scripts, tmp_path, capsys):
    root = make_folder(str(tmp_path / "bin"), "splitdirs", encoding="binary")
    data = get_segmentation_dataset("folder", root=root, split="val", mode="testval")
    assert data.CLASSES == ("background", "foreground") and sorted(data[0][1].unique().tolist()) == [0, 1]
    result = _train(scripts, root, tmp_path / "runs", "--binary", "--loss", "dice")
    assert {"fgIoU", "fgDice", "precision", "recall"} <= set(result)
    assert "fgIoU" in capsys.readouterr().out  # in the summary line of the table
    row = json.loads((tmp_path / "runs" / "folder" / "unet" / "default" / "log.jsonl").read_text().splitlines()[-1])
    assert row["fgIoU"] == pytest.approx(result["fgIoU"])
    model = encoding.load_model(str(tmp_path / "runs" / "folder" / "unet" / "default" / "checkpoint.pth"))
    assert model.info.binary and model(torch.zeros(1, 3, 16, 16))["out"].shape[1] == 1
    assert set(encoding.segment(model, os.path.join(root, "val", "images", "img06.jpg")).unique().tolist()) <= {0, 1}
    ckpt = str(tmp_path / "runs" / "folder" / "unet" / "default" / "checkpoint.pth")
    scores = scripts["test"].main(["--resume", ckpt, "--workers", "0", "--save-pred", str(tmp_path / "preds"),
                                   "--out-dir", str(tmp_path / "eval")])
    assert "fgIoU" in json.loads((tmp_path / "eval" / "metrics.json").read_text()) and "fgIoU" in scores
    saved = np.array(Image.open(tmp_path / "preds" / "img06.png"))
    assert saved.shape == (20, 24) and set(np.unique(saved).tolist()) <= {0, 1}
    multi = make_folder(str(tmp_path / "multi"), "splitdirs", classes=CLASSES_YAML)
    result = _train(scripts, multi, tmp_path / "runs2", "--binary-class", "red")
    assert "fgIoU" in result
    with pytest.raises(ConfigError, match="has 3 classes .* --binary-class NAME"):
        _train(scripts, multi, tmp_path / "runs3", "--binary")
    assert not (tmp_path / "runs3").exists()


def test_same_file_names_in_two_sub_folders_are_two_predictions(tmp_path):
    """Samples are named by their path below their split's shared folder, and predictions keep those folders: two
    ``frame.png`` of ``cam_a/`` and ``cam_b/`` are two files (PE's flat names where the folder is flat)."""
    root = tmp_path / "cams"
    for split in ("train", "val"):
        for cam, cls in (("cam_a", 1), ("cam_b", 2)):
            for kind in ("images", "masks"):
                (root / split / kind / cam).mkdir(parents=True)
            mask = np.zeros((16, 16), np.uint8)
            mask[4:12, 4:12] = cls
            Image.fromarray(np.full((16, 16, 3), 60 * cls, np.uint8)).save(root / split / "images" / cam / "frame.png")
            Image.fromarray(mask).save(root / split / "masks" / cam / "frame.png")
    (root / "classes.yaml").write_text("classes: [background, a, b]\n")
    data = FolderSegmentation(str(root), split="val", mode="testval", return_name=True)
    names = [data[i][2] for i in range(len(data))]
    assert names == ["cam_a/frame.png", "cam_b/frame.png"]
    writer = PredictionWriter(str(tmp_path / "preds"), [(0, 0, 0), (255, 0, 0), (0, 0, 255)])
    writer([data[i][1].clamp(min=0) for i in range(len(data))], names)
    for name, cls in zip(names, (1, 2)):
        assert np.unique(np.array(Image.open(tmp_path / "preds" / name))).tolist() == [0, cls]
    flat = make_folder(str(tmp_path / "flat"), "splitdirs")
    data = FolderSegmentation(flat, split="val", mode="testval", return_name=True)
    assert data[0][2] == os.path.basename(data.images[0])
    assert [prediction_filename(n) for n in ("a.jpg", "cam/a.jpg", "/data/x/a.jpg", "../up/a.jpg")] == [
        "a.png", os.path.join("cam", "a.png"), "a.png", "a.png"]  # never outside the output folder


def _bad(tmp_path, case):
    root = make_folder(str(tmp_path / case), "flat", classes="classes: [bg, red, blue]\n")
    masks, images = os.path.join(root, "masks"), os.path.join(root, "images")
    if case == "unpaired":
        os.remove(os.path.join(masks, "img03.png"))
        return os.path.join(images, "img03.jpg"), "without a mask"
    if case == "size":
        Image.fromarray(np.zeros((10, 24), np.uint8)).save(os.path.join(masks, "img04.png"))
        return os.path.join(masks, "img04.png"), "differs from its image"
    if case == "values":
        Image.fromarray(np.full((20, 24), 7, np.uint8)).save(os.path.join(masks, "img02.png"))
        return os.path.join(masks, "img02.png"), r"label values \[7\]"
    with open(os.path.join(images, "img05.jpg"), "wb") as f:
        f.write(b"not an image")
    return os.path.join(images, "img05.jpg"), "cannot decode"


@pytest.mark.parametrize("case", ["unpaired", "size", "values", "unreadable"])
def test_each_bad_data_case_is_one_line_naming_the_file_exit_2_nothing_left(case, tmp_path, capsys, monkeypatch,
                                                                           scripts):
    """The dataset raises naming the file; train.py's command line says it in one line on stderr, exit status 2,
    and leaves no run directory."""
    path, what = _bad(tmp_path, case)
    with pytest.raises(DatasetError, match=what) as err:
        FolderSegmentation(os.path.dirname(os.path.dirname(path)))
    assert err.value.path == path
    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    out = tmp_path / "runs"
    capsys.readouterr()
    status = scripts["train"].cli(["--dataset", "folder", "--data-root", os.path.dirname(os.path.dirname(path)),
                                   "--output-dir", str(out), *TINY])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and path in lines[0], lines
    assert not out.exists()


def test_unknown_labels_ignore_maps_and_counts(tmp_path):
    path, _ = _bad(tmp_path, "values")
    data = FolderSegmentation(os.path.dirname(os.path.dirname(path)), unknown_labels="ignore", split="train",
                              mode="testval")
    assert data.scan.unknown == 20 * 24 and data.scan.unknown_files == 1 and "ignored (--unknown-labels" in \
        data.scan.summary()
    index = data.masks.index(path)
    assert (data[index][1] == -1).all()


def test_the_scan_is_cached_and_reads_changed_files_again(tmp_path, monkeypatch):
    root = make_folder(str(tmp_path / "d"), "flat")
    FolderSegmentation(root)
    assert os.path.isfile(scan_module.cache_file(root)) and str(tmp_path / "cache") in scan_module.cache_file(root)
    assert not [n for n in os.listdir(root) if n.startswith(".")]  # nothing in the data root
    calls = []
    real = scan_module._record
    monkeypatch.setattr(scan_module, "_record", lambda *a: calls.append(a) or real(*a))
    FolderSegmentation(root, split="val")
    assert calls == []
    Image.fromarray(np.full((20, 24), 1, np.uint8)).save(os.path.join(root, "masks", "img01.png"))
    os.utime(os.path.join(root, "masks", "img01.png"), ns=(1, 1))
    FolderSegmentation(root)
    assert [os.path.basename(c[1]) for c in calls] == ["img01.png"]


@pytest.mark.parametrize("layout", ["splitdirs", "mmseg"])
def test_an_unlabelled_test_folder_is_left_out_not_refused(tmp_path, layout):
    """Test images without masks (mmsegmentation's usual test split) are not a split to train on or to score."""
    root = make_folder(str(tmp_path / "d"), layout)
    images = os.path.join(root, *(("test", "images") if layout == "splitdirs" else ("img_dir", "test")))
    os.makedirs(images)
    Image.fromarray(np.zeros((20, 24, 3), np.uint8)).save(os.path.join(images, "unlabelled.jpg"))
    data = FolderSegmentation(root)
    assert data.SPLITS == ("train", "val") and len(data) == 6
    with pytest.raises(ValueError, match="unknown split 'test'; valid splits: train, val"):
        FolderSegmentation(root, split="test", mode="test")


def test_the_hold_out_is_listed_and_reused(tmp_path):
    root = make_folder(str(tmp_path / "d"), "flat", n_train=18, n_val=2)
    first = FolderSegmentation(root, split="val", val_fraction=0.2, holdout_seed=1)
    assert len(first) == 4
    listing = str(tmp_path / "holdout.json")
    first.save_holdout(listing)
    again = FolderSegmentation(root, split="val", val_fraction=0.5, holdout_seed=7, holdout_file=listing)
    assert again.images == first.images
    train = FolderSegmentation(root, split="train", holdout_file=listing)
    assert not set(train.images) & set(first.images) and len(train) == 16
    other = FolderSegmentation(root, split="val", val_fraction=0.2, holdout_seed=2)
    assert other.images != first.images
    # with the defaults, Python, the scan and a default run draw the same hold-out
    from encoding.config import TrainingConfig
    from encoding.datasets.scan.__main__ import build_parser
    assert HOLDOUT_SEED == TrainingConfig().seed == build_parser().parse_args([root]).seed
    assert FolderSegmentation(root, split="val", val_fraction=0.2).images == first.images


class _Mine(encoding.datasets.BaseDataset):
    """A user's registered dataset: 3 classes, its own sizes, no palette."""

    NAME = "mine"
    NUM_CLASS = 3
    CLASSES = ("a", "b", "c")
    BASE_SIZE, CROP_SIZE = 28, 20
    PALETTE = None

    def _check_root(self):
        pass

    def _find_samples(self):
        folder = os.path.join(self.root, "train" if self.split == "train" else "val")
        stems = sorted(os.path.splitext(f)[0] for f in os.listdir(os.path.join(folder, "images")))
        return ([os.path.join(folder, "images", s + ".jpg") for s in stems],
                [os.path.join(folder, "masks", s + ".png") for s in stems])


def test_user_dataset_classes_work_end_to_end(tmp_path, monkeypatch):
    from encoding.datasets import datasets
    from encoding.engine.assemble import TrainingConfig, run_training
    root = make_folder(str(tmp_path / "d"), "splitdirs")
    monkeypatch.setitem(datasets, "mine", _Mine)
    config = TrainingConfig(dataset="mine", data_root=root, epochs=1, batch_size=4, workers=0,
                            output_dir=str(tmp_path / "runs"))
    run_training(config)
    ckpt = tmp_path / "runs" / "mine" / "unet" / "default" / "checkpoint.pth"
    saved = torch.load(ckpt, weights_only=True)["args"]
    assert (saved["base_size"], saved["crop_size"]) == (28, 20)  # the class's own sizes, not the built-in run's
    assert saved["dataset_class"].endswith(":_Mine")
    assert saved["palette"] == [[0, 0, 0], [128, 0, 0], [0, 128, 0]]  # PALETTE = None: generated
    probe = ("import encoding; m = encoding.load_model(%r, trust_code=True); print(m.info.classes, m.info.crop_size)"
             % str(ckpt))  # the checkpoint names the test's dataset class: code of its author's, trusted here
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=str(tmp_path),
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0 and "('a', 'b', 'c') 20" in proc.stdout, proc.stderr
    # test.py in a new process that never registered the class: it is imported from the path the checkpoint records
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "segmentation", "test.py"), "--resume",
                           str(ckpt), "--trust-code", "--workers", "0", "--out-dir", str(tmp_path / "eval")],
                          capture_output=True,
                          text=True, cwd=str(tmp_path),
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])})
    assert proc.returncode == 0 and "on mine 'val'" in proc.stdout, proc.stderr


def test_run_training_with_datasets_builds_for_them(tmp_path, capsys):
    from encoding.engine.assemble import TrainingConfig, run_training
    root = make_folder(str(tmp_path / "d"), "splitdirs", classes=CLASSES_YAML)
    datasets = (FolderSegmentation(root, split="train", base_size=24, crop_size=16),
                FolderSegmentation(root, split="val", base_size=24, crop_size=16))
    result = run_training(TrainingConfig(epochs=1, batch_size=4, workers=0, output_dir=str(tmp_path / "runs")),
                          datasets=datasets)
    assert result["IoU"].shape == (3,)
    assert "on folder" in capsys.readouterr().out
    assert (tmp_path / "runs" / "folder").is_dir() and not (tmp_path / "runs" / "shapes").exists()
    text = (tmp_path / "runs" / "folder" / "unet" / "default" / "config.yaml").read_text()
    assert re.search(r'^dataset: "?folder"?$', text, re.M) and "shapes" not in text


def test_previews_draw_with_the_recorded_colours(tmp_path):
    from encoding.engine.assemble import TrainingConfig, build_training
    from encoding.engine.previews import validation_previews
    from encoding.utils.palette import overlay
    root = make_folder(str(tmp_path / "d"), "splitdirs", encoding="color", classes=CLASSES_YAML)
    config = TrainingConfig(dataset="folder", data_root=root, base_size=24, crop_size=16, batch_size=4, workers=0,
                            output_dir=str(tmp_path / "runs"))
    run = build_training(config)
    assert run.options["palette"] == [list(c) for c in COLORS] and run.class_names == ["bg", "red", "blue"]
    val = run.datasets()[1]
    previews = validation_previews(run.model, val, run.options["palette"], count=1)
    image, mask = val[0][:2]
    shown = previews["val/0"][:, :image.shape[-1]]
    want = np.asarray(overlay(shown, mask.numpy(), COLORS))
    assert (previews["val/0"][:, image.shape[-1]:2 * image.shape[-1]] == want).all()  # red where the mask is red
    assert (mask == 1).any() and not (want == np.asarray(overlay(shown, mask.numpy(), "shapes"))).all()
