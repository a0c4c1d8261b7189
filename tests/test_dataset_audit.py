"""The dataset audit's findings, each with generated data in ``tmp_path`` (no download):

1. a registered dataset reads its masks upright by their EXIF orientation, as its images (the folder dataset's rule);
2. ``base_size`` / ``crop_size`` ``None`` is the default, anything but a positive whole number is refused, as are a
   ``scale_range`` that is not ``0 < min <= max`` and a negative ``jitter``, in every mode (one line naming them);
3. ``mean`` / ``std`` with ``transform=`` (which replaces their normalisation) are refused, not silently dropped;
4. a mask over the pixel limit raises ``ImageTooLarge`` as an image does (never a skippable "cannot decode");
5. PASCAL-Context's and COCO's converters write masks and lists as one unit: a run interrupted at any point is redone
   by the next one, never taken as complete with new lists over old masks;
6. a ``--binary`` folder dataset with ``unknown_labels="ignore"`` ignores a colour mask's unknown (and ignore)
   colours, as its scan reports, instead of reading them as foreground.
"""
import json
import math
import os

import numpy as np
import pytest
import torch
from PIL import Image

import encoding.utils.files as files
from encoding.datasets import DatasetError, FolderSegmentation, get_segmentation_dataset
from encoding.datasets.prepare.coco_masks import build_coco_masks
from encoding.datasets.prepare.pcontext_json import convert_context_annotations
from encoding.errors import UsageError
from encoding.utils.images import ImageTooLarge, set_max_pixels
import test_datasets
from test_datasets import context_json, make_coco, make_voc, save_label, write_lines

#: pycocotools' COCO replaced by test_datasets' small stand-in (a pytest fixture).
fake_pycocotools = test_datasets.fake_pycocotools


@pytest.fixture(autouse=True)
def _cache_in_tmp(tmp_path, monkeypatch):
    """The folder scan's cache lives in the test's temporary folder, not the user's ~/.cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _one_line(err):
    text = str(err.value)
    assert "\n" not in text, text
    return text


# ----------------------------------------------------------------------------- 1. masks upright, as their images
def _save_with_orientation(path, array, orientation):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(array).save(path, exif=exif.tobytes(), **({"quality": 95} if path.endswith(".jpg") else {}))


# EXIF orientation -> the array stored so that it is displayed as the array given (numpy on rows x columns)
_STORED = {3: lambda a: np.rot90(a, 2), 6: lambda a: np.rot90(a, 1)}


@pytest.mark.parametrize("orientation", [3, 6])
def test_a_registered_dataset_reads_its_mask_upright_as_its_image(tmp_path, orientation):
    shown = np.zeros((24, 40), np.uint8)
    shown[:, :12] = 1  # displayed: class 1 on the left third (bright image), class 0 elsewhere (dark)
    base = os.path.join(str(tmp_path), "VOCdevkit", "VOC2012")
    image = np.where(shown[..., None] == 1, 250, 5).astype(np.uint8).repeat(3, 2)
    _save_with_orientation(os.path.join(base, "JPEGImages", "a.jpg"), _STORED[orientation](image).copy(), orientation)
    _save_with_orientation(os.path.join(base, "SegmentationClass", "a.png"), _STORED[orientation](shown).copy(),
                           orientation)
    write_lines(os.path.join(base, "ImageSets", "Segmentation", "train.txt"), ["a"])
    ds = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="train", mode="testval")
    image, mask = ds[0]
    assert tuple(mask.shape) == shown.shape
    assert torch.equal(mask, torch.from_numpy(shown).long())
    assert torch.equal(mask == 1, image.mean(0) > 0)
    assert np.array_equal(ds.label_map(0), shown)  # the class counts read them upright too


# ------------------------------------------------------------------------------------------- 2. size options
@pytest.fixture
def voc(tmp_path):
    make_voc(str(tmp_path))
    return str(tmp_path)


def test_none_sizes_are_the_class_defaults(voc):
    ds = get_segmentation_dataset("pascal_voc", root=voc, split="train", base_size=None, crop_size=None)
    assert (ds.base_size, ds.crop_size) == (520, 480)
    ds = get_segmentation_dataset("pascal_voc", root=voc, split="train", base_size=np.int64(64), crop_size=48)
    assert (ds.base_size, ds.crop_size) == (64, 48) and tuple(ds[0][0].shape) == (3, 48, 48)


@pytest.mark.parametrize("mode", ["train", "val", "testval"])
@pytest.mark.parametrize("option, value", [
    ("crop_size", 0), ("crop_size", -8), ("crop_size", 2.5), ("crop_size", True), ("crop_size", "480"),
    ("base_size", 0), ("base_size", -10),
    ("scale_range", (2.0, 0.5)), ("scale_range", (0.0, 1.0)), ("scale_range", (-1.0, 2.0)), ("scale_range", (0.5,)),
    ("scale_range", (0.5, math.inf)), ("scale_range", (math.nan, 1.0)), ("scale_range", "12"),
    ("scale_range", (0.001, 1.0)),  # 0.001 x base_size 520: a long side under one pixel
    ("jitter", -0.1), ("jitter", math.nan), ("jitter", "0.4")])
def test_bad_sizes_and_augmentations_are_refused_in_one_line_naming_them(voc, mode, option, value):
    with pytest.raises(UsageError) as err:
        get_segmentation_dataset("pascal_voc", root=voc, split="train", mode=mode, **{option: value})
    assert isinstance(err.value, ValueError)
    text = _one_line(err)
    assert text.startswith(option) and repr(value) in text


def test_jitter_and_scale_range_still_act_in_train_mode_alone(voc):
    plain = get_segmentation_dataset("pascal_voc", root=voc, split="val", mode="val", crop_size=32)
    tuned = get_segmentation_dataset("pascal_voc", root=voc, split="val", mode="val", crop_size=32, jitter=0.9,
                                     scale_range=[3.0, 4.0])
    assert torch.equal(plain[0][0], tuned[0][0]) and torch.equal(plain[0][1], tuned[0][1])
    train = get_segmentation_dataset("pascal_voc", root=voc, split="train", base_size=64, crop_size=16,
                                     scale_range=[1.0, 1.0])
    assert tuple(train[0][0].shape) == (3, 16, 16)


# --------------------------------------------------------------------------------- 3. mean / std with transform=
def test_mean_or_std_with_a_transform_is_refused_naming_both(voc):
    def transform(image):
        return image.float() / 255

    for options in ({"mean": (0.9, 0.9, 0.9)}, {"std": [0.01, 0.01, 0.01]}):
        with pytest.raises(UsageError) as err:
            get_segmentation_dataset("pascal_voc", root=voc, split="val", mode="testval", transform=transform,
                                     **options)
        text = _one_line(err)
        assert "mean" in text and "std" in text and "transform=" in text
    # the defaults' values with transform=, or mean/std without it, stay fine
    ds = get_segmentation_dataset("pascal_voc", root=voc, split="val", mode="testval", transform=transform,
                                  mean=[0.485, 0.456, 0.406], std=(0.229, 0.224, 0.225))
    assert float(ds[0][0].max()) <= 1.0
    shifted = get_segmentation_dataset("pascal_voc", root=voc, split="val", mode="testval", mean=(0, 0, 0),
                                       std=(1, 1, 1))
    assert float(shifted[0][0].min()) >= 0.0


# --------------------------------------------------------------------------------- 4. a mask over the pixel limit
def test_a_mask_over_the_pixel_limit_raises_image_too_large_even_with_skip_bad(voc):
    base = os.path.join(voc, "VOCdevkit", "VOC2012")
    ids = sorted(n[:-4] for n in os.listdir(os.path.join(base, "SegmentationClass")))
    save_label(os.path.join(base, "SegmentationClass", ids[0] + ".png"), np.zeros((200, 200)))  # 40000 pixels
    set_max_pixels(10_000)  # every image (at most 72 x 48) is under it; that mask is over it
    try:
        with pytest.raises(ImageTooLarge, match=r"2007_000000\.png: image of 200 x 200"):
            get_segmentation_dataset("pascal_voc", root=voc, split="val", mode="testval", skip_bad=True)
        train = get_segmentation_dataset("pascal_voc", root=voc, split="train", skip_bad=True)
        with pytest.raises(ImageTooLarge):
            train[0]  # not skipped for the next sample: the limit is a setting, not a bad file
        assert train.num_skipped == 0
        with pytest.raises(ImageTooLarge):
            train.label_map(0)
    finally:
        set_max_pixels(None)


# ----------------------------------------------------------------- 5. masks and lists of a conversion are one unit
class Killed(BaseException):
    """The process dying at an ``os.replace`` (a kill between two renames)."""


def _interrupted_everywhere(monkeypatch, first, overwrite, rerun, check):
    """Run ``first``, then ``overwrite`` killed at its 1st, 2nd, ... rename (every file and folder swap of the
    conversion), then ``rerun`` (no overwrite): each time, ``check`` must find the overwrite's result whole."""
    real, calls = os.replace, []

    def counting(src, dst):
        calls.append(src)
        if len(calls) == kill_at:
            raise Killed(f"killed at rename {kill_at}: {src}")
        return real(src, dst)

    first()
    kill_at = 0
    monkeypatch.setattr(files.os, "replace", counting)
    overwrite()  # counted, not killed: the renames an overwrite makes
    renames = len(calls)
    assert renames >= 2
    for kill_at in range(1, renames + 1):
        first()
        calls.clear()
        with pytest.raises(Killed):
            overwrite()
        rerun()
        check(kill_at)
    monkeypatch.setattr(files.os, "replace", real)


def _context(path, category, phase_of_b):
    """A two-image PASCAL-in-Detail file, each image all one category (4 x 4)."""
    whole = np.ones((4, 4), bool)
    return context_json(str(path), [("a.jpg", "train", 4, 4, [(category, whole)]),
                                    ("b.jpg", phase_of_b, 4, 4, [(category, whole)])])


def test_an_interrupted_pcontext_conversion_is_redone_never_half_trusted(tmp_path, monkeypatch):
    voc = str(tmp_path / "VOCdevkit" / "VOC2010")
    old, new = _context(tmp_path / "old.json", 2, "val"), _context(tmp_path / "new.json", 9, "train")  # 1, then 2
    lists = os.path.join(voc, "ImageSets", "SegmentationContext")

    def check(kill_at):
        masks = {n: np.unique(np.array(Image.open(os.path.join(voc, "SegmentationClassContext", n + ".png"))))
                 for n in ("a", "b")}
        assert {n: v.tolist() for n, v in masks.items()} == {"a": [2], "b": [2]}, f"killed at rename {kill_at}"
        with open(os.path.join(lists, "train.txt")) as f, open(os.path.join(lists, "val.txt")) as g:
            assert (f.read(), g.read()) == ("a\nb\n", ""), f"killed at rename {kill_at}"

    _interrupted_everywhere(
        monkeypatch, lambda: convert_context_annotations(old, voc, overwrite=True, progress=False),
        lambda: convert_context_annotations(new, voc, overwrite=True, progress=False),
        lambda: convert_context_annotations(new, voc, progress=False), check)
    os.remove(new)  # a complete conversion is still skipped (its annotation file is not read again)
    assert convert_context_annotations(new, voc, progress=False) == {"train": 2, "val": 0}


def test_an_interrupted_coco_build_is_redone_never_half_trusted(tmp_path, monkeypatch, fake_pycocotools):
    base = make_coco(str(tmp_path))
    ann_file = os.path.join(base, "annotations", "instances_val2017.json")
    with open(ann_file) as f:
        data = json.load(f)
    old = json.dumps(data)
    for ann in data["annotations"]:
        ann["category_id"] = {18: 17, 13: 18}.get(ann["category_id"], ann["category_id"])  # dog -> cat, stop -> dog
    new = json.dumps(data)

    def build(text, overwrite):
        with open(ann_file, "w") as f:
            f.write(text)
        return build_coco_masks(base, "val", overwrite=overwrite, progress=False)

    def check(kill_at):
        with open(os.path.join(base, "masks_voc", "val2017.txt")) as f:
            assert f.read().split() == ["000000000001", "000000000002"], f"killed at rename {kill_at}"
        mask = np.array(Image.open(os.path.join(base, "masks_voc", "val2017", "000000000001.png")))
        assert mask[5, 5] == 8, f"killed at rename {kill_at}"  # the cat of the new annotations

    _interrupted_everywhere(monkeypatch, lambda: build(old, True), lambda: build(new, True),
                            lambda: build(new, False), check)


# ------------------------------------------------- 6. binary colour masks: unknown and ignore colours are ignored
def _crack_folder(tmp_path, extra=""):
    """An empty folder dataset of classes background (black) and crack (red), ``extra`` added to its class file."""
    root = str(tmp_path / "data")
    os.makedirs(os.path.join(root, "images"))
    os.makedirs(os.path.join(root, "masks"))
    with open(os.path.join(root, "classes.yaml"), "w") as f:
        f.write("classes: [background, crack]\ncolors: [[0, 0, 0], [255, 0, 0]]\n" + extra)
    return root


def test_a_binary_colour_mask_ignores_unknown_and_ignore_colours_as_its_scan_says(tmp_path):
    root = _crack_folder(tmp_path, "ignore_color: [255, 255, 255]\n")
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(f"{root}/images/{i}.png")
        index = np.zeros((16, 16), np.uint8)
        index[4:8, 4:8] = 255  # 0/255 index masks: 255 is the crack
        Image.fromarray(index).save(f"{root}/masks/{i}.png")
    colour = np.zeros((16, 16, 3), np.uint8)
    colour[2:4, 2:4] = (255, 0, 0)  # 4 crack pixels
    colour[10:14, 10:14] = (0, 255, 0)  # 16 pixels of no class
    colour[0, :] = (255, 255, 255)  # 16 ignored pixels
    Image.fromarray(colour).save(f"{root}/masks/3.png")
    for split in ("train", "val"):
        ds = FolderSegmentation(root, split=split, mode="testval", binary=True, unknown_labels="ignore",
                                val_fraction=0.25, scan_cache=False)
        assert ds.scan.binary_255
        for i, path in enumerate(ds.masks):
            mask = ds[i][1]
            if path.endswith("3.png"):
                assert int((mask == 1).sum()) == 4 and int((mask == -1).sum()) == 32
                assert (mask[10:14, 10:14] == -1).all() and (mask[0] == -1).all()
                assert np.array_equal(ds.label_map(i) == 255, (mask == -1).numpy())
            else:
                assert int((mask == 1).sum()) == 16 and int((mask == -1).sum()) == 0
    assert "16 pixels in 1 masks hold values outside the classes and are ignored" in ds.scan.summary()


def test_a_colour_mask_of_unknown_colours_names_them_when_they_are_refused(tmp_path):
    root = _crack_folder(tmp_path)
    for i in range(2):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(f"{root}/images/{i}.png")
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(f"{root}/masks/{i}.png")
    ds = FolderSegmentation(root, split="train", mode="testval", val_fraction=0.5, scan_cache=False)
    green = np.zeros((8, 8, 3), np.uint8)
    green[:2] = (0, 255, 0)
    Image.fromarray(green).save(ds.masks[0])  # changed after the scan: the loader's own check
    with pytest.raises(DatasetError, match=r"colours \(0, 255, 0\) are not class colours"):
        ds[0]
