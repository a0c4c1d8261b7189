"""encoding.datasets: registry, every real layout (tiny fakes on disk), label mapping, transforms, collate, bad input.

The fake scenes make the mask derivable from the image: every class has its own flat colour, so after any joint
transform the colour under each labelled pixel must still name that pixel's class.
"""
import json
import os
import sys
import types
import warnings

import numpy as np
import pytest
import scipy.io
import torch
from PIL import Image, ImageDraw

import encoding.datasets as eds
from encoding.datasets import DatasetError, get_segmentation_dataset, pad_collate
from encoding.datasets.prepare import convert_context_annotations, decode_rle
from encoding.datasets.prepare.coco_masks import build_coco_masks
from encoding.datasets.prepare.sbd import convert_sbd_masks, read_sbd_segmentation

MEAN = torch.tensor(eds.IMAGENET_MEAN).view(3, 1, 1)
STD = torch.tensor(eds.IMAGENET_STD).view(3, 1, 1)
COLOURS = np.array([(230, 30, 30), (30, 200, 40), (40, 60, 230), (240, 230, 40)], dtype=np.uint8)
GREY = np.array([128, 128, 128], dtype=np.uint8)


# ----------------------------------------------------------------------------------------------- fake data helpers
def class_pattern(height, width, offset=0, ignore_border=False):
    """Class map (-1 = ignore) of 16-px blocks of 4 classes; optional ignore band on block borders."""
    ys, xs = np.mgrid[0:height, 0:width]
    cls = ((xs // 16) + 2 * (ys // 16) + offset) % 4
    if ignore_border:
        cls = np.where((xs % 16 == 0) | (ys % 16 == 0), -1, cls)
    return cls


def paint(cls):
    image = COLOURS[np.clip(cls, 0, None)]
    image[cls < 0] = GREY
    return image


def save_image(path, cls):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(paint(cls)).save(path, quality=95)


def save_label(path, raw):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.asarray(raw, dtype=np.uint8)).save(path)


def write_lines(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))


def save_sbd_mat(path, seg):
    """SBD's cls/*.mat structure (struct GTcls with a uint8 Segmentation field), written by SciPy."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    scipy.io.savemat(path, {"GTcls": {"Segmentation": np.asarray(seg, dtype=np.uint8)}}, do_compression=True)


SIZES = [(48, 72), (40, 56), (56, 40)]


def make_voc(root, n=3, ignore_border=True):
    base = os.path.join(root, "VOCdevkit", "VOC2012")
    ids = [f"2007_{i:06d}" for i in range(n)]
    for i, name in enumerate(ids):
        cls = class_pattern(*SIZES[i % 3], offset=i, ignore_border=ignore_border)
        save_image(os.path.join(base, "JPEGImages", name + ".jpg"), cls)
        save_label(os.path.join(base, "SegmentationClass", name + ".png"), np.where(cls < 0, 255, cls))
    write_lines(os.path.join(base, "ImageSets", "Segmentation", "train.txt"), ids)
    write_lines(os.path.join(base, "ImageSets", "Segmentation", "val.txt"), ids[:2])
    return base, ids


def make_ade(root, n=2):
    base = os.path.join(root, "ADEChallengeData2016")
    for folder in ("training", "validation"):
        for i in range(n):
            name = f"ADE_{folder[:5]}_{i:08d}"
            cls = class_pattern(*SIZES[i % 3], offset=i, ignore_border=True)
            raw = np.where(cls < 0, 0, cls + 1)
            raw[0, :4] = 150  # the last class
            save_image(os.path.join(base, "images", folder, name + ".jpg"), cls)
            save_label(os.path.join(base, "annotations", folder, name + ".png"), raw)
    return base


ID_OF_TRAIN_ID = {0: 7, 1: 8, 2: 11, 3: 26}  # road, sidewalk, building, car


def make_citys(root, split="train", cities=("aachen", "bonn")):
    base = os.path.join(root, "citys")
    for c, city in enumerate(cities):
        name = f"{city}_000000_{c:06d}"
        cls = class_pattern(32, 64, offset=c, ignore_border=True)
        raw = np.vectorize(lambda k: ID_OF_TRAIN_ID.get(int(k), 0))(cls)
        raw[0, :3] = 33  # bicycle -> trainId 18
        raw[1, :3] = 5   # a void id -> ignore
        save_image(os.path.join(base, "leftImg8bit", split, city, name + "_leftImg8bit.png"), cls)
        save_label(os.path.join(base, "gtFine", split, city, name + "_gtFine_labelIds.png"), raw)
    return base


def make_aug(root, n=2):
    base = os.path.join(root, "VOCaug", "dataset")
    ids = [f"2008_{i:06d}" for i in range(n)]
    for i, name in enumerate(ids):
        cls = class_pattern(*SIZES[i % 3], offset=i, ignore_border=True)
        save_image(os.path.join(base, "img", name + ".jpg"), cls)
        save_sbd_mat(os.path.join(base, "cls", name + ".mat"), np.where(cls < 0, 255, cls))
    write_lines(os.path.join(base, "train.txt"), ids)
    write_lines(os.path.join(base, "val.txt"), ids[1:])
    return base, ids


def rle_string(mask):
    """COCO compressed RLE of a bool mask (column-major runs, background first) -- the format the JSON uses."""
    flat = np.asarray(mask, dtype=np.uint8).T.ravel()
    runs, current, count = [], 0, 0
    for v in flat:
        if v == current:
            count += 1
        else:
            runs.append(count)
            current, count = v, 1
    runs.append(count)
    out = []
    for i, x in enumerate(runs):
        if i > 2:
            x -= runs[i - 2]
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = (x != -1) if c & 0x10 else (x != 0)
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return "".join(out)


def context_json(path, images):
    """A PASCAL-in-Detail style JSON; ``images`` = [(file_name, phase, h, w, [(category_id, bool mask), ...])]."""
    data = {"images": [], "annos_segmentation": []}
    for image_id, (file_name, phase, h, w, anns) in enumerate(images, start=1):
        data["images"].append({"image_id": image_id, "file_name": file_name, "phase": phase, "height": h, "width": w})
        for k, (cat, mask) in enumerate(anns):
            counts = rle_string(mask) if k % 2 == 0 else None
            if counts is None:  # every other annotation in uncompressed (list) form
                flat = np.asarray(mask, dtype=np.uint8).T.ravel()
                change = np.flatnonzero(np.diff(np.concatenate([[0], flat, [1 - flat[-1]]])))
                counts = np.diff(np.concatenate([[0], change])).tolist()
            data["annos_segmentation"].append({"id": len(data["annos_segmentation"]) + 1, "image_id": image_id,
                                               "category_id": cat,
                                               "segmentation": {"size": [h, w], "counts": counts}})
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def make_context(root):
    """VOC2010 images + trainval_merged.json; returns (voc_root, json_path, expected class maps)."""
    voc_root = os.path.join(root, "VOCdevkit", "VOC2010")
    h, w = 24, 32
    ys, xs = np.mgrid[0:h, 0:w]
    left, top, square = xs < 16, ys < 12, (xs > 20) & (ys > 14)
    images, expected = [], {}
    for i, phase in enumerate(("train", "val", "train")):
        name = f"2008_{i:06d}"
        # category 2 (aeroplane, class 0) on the left, 458 (wood, class 58) on top -- painted later, wins on overlap;
        # 5 is not one of the 59 classes and becomes ignore.
        anns = [(2, left), (458, top), (5, square)]
        cls = np.full((h, w), -1)
        cls[left] = 0
        cls[top] = 58
        cls[square] = -1
        images.append((name + ".jpg", phase, h, w, anns))
        expected[name] = cls
        save_image(os.path.join(voc_root, "JPEGImages", name + ".jpg"), np.clip(cls, -1, 3))
    json_path = context_json(os.path.join(root, "trainval_merged.json"), images)
    return voc_root, json_path, expected


class FakeCOCO:
    """The part of ``pycocotools.coco.COCO`` the mask builder uses, with polygon masks drawn by PIL."""

    def __init__(self, path):
        with open(path) as f:
            data = json.load(f)
        self.imgs = {img["id"]: img for img in data["images"]}
        self.anns = {ann["id"]: ann for ann in data["annotations"]}

    def getImgIds(self):  # noqa: N802 - pycocotools API
        return list(self.imgs)

    def loadImgs(self, image_id):  # noqa: N802
        return [self.imgs[image_id]]

    def getAnnIds(self, imgIds, iscrowd=None):  # noqa: N802,N803
        return [i for i, a in self.anns.items() if a["image_id"] == imgIds]

    def loadAnns(self, ids):  # noqa: N802
        return [self.anns[i] for i in ids]

    def annToMask(self, ann):  # noqa: N802
        img = self.imgs[ann["image_id"]]
        canvas = Image.new("L", (img["width"], img["height"]), 0)
        for poly in ann["segmentation"]:
            ImageDraw.Draw(canvas).polygon(poly, fill=1)
        return np.asarray(canvas)


@pytest.fixture()
def fake_pycocotools(monkeypatch):
    package = types.ModuleType("pycocotools")
    module = types.ModuleType("pycocotools.coco")
    module.COCO = FakeCOCO
    package.coco = module
    monkeypatch.setitem(sys.modules, "pycocotools", package)
    monkeypatch.setitem(sys.modules, "pycocotools.coco", module)


def make_coco(root, split="val"):
    """Two images: one with dog (18 -> class 12) under person (1 -> class 15), one with only a non-VOC category."""
    base = os.path.join(root, "coco")
    h, w = 48, 64
    images, anns = [], []
    for image_id in (1, 2):
        images.append({"id": image_id, "file_name": f"{image_id:012d}.jpg", "height": h, "width": w})
        save_image(os.path.join(base, f"{split}2017", f"{image_id:012d}.jpg"), class_pattern(h, w))
    square = [0, 0, 40, 0, 40, 40, 0, 40]
    for image_id, cat, poly in ((1, 18, square), (1, 1, [20, 0, 63, 0, 63, 47, 20, 47]),
                                (1, 13, [0, 41, 10, 41, 10, 47, 0, 47]), (2, 13, square)):
        xs, ys = poly[0::2], poly[1::2]
        anns.append({"id": len(anns) + 1, "image_id": image_id, "category_id": cat, "segmentation": [poly],
                     "iscrowd": 0, "area": 1.0, "bbox": [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]})
    categories = [{"id": c, "name": str(c), "supercategory": "x"} for c in (1, 13, 18)]
    os.makedirs(os.path.join(base, "annotations"), exist_ok=True)
    with open(os.path.join(base, "annotations", f"instances_{split}2017.json"), "w") as f:
        json.dump({"images": images, "annotations": anns, "categories": categories}, f)
    return base


def denormalise(image):
    return ((image * STD + MEAN) * 255).clamp(0, 255)


def colour_agreement(image, mask):
    """Fraction of labelled pixels whose (de-normalised) colour is nearest to their class colour."""
    rgb = denormalise(image).permute(1, 2, 0).reshape(-1, 3).numpy()
    labels = mask.reshape(-1).numpy()
    keep = labels >= 0
    dist = ((rgb[keep, None, :] - COLOURS[None].astype(np.float32)) ** 2).sum(-1)
    return float((dist.argmin(1) == labels[keep]).mean())


# ----------------------------------------------------------------------------------------------------- registry
def test_registry_names_counts_and_lookup_errors():
    from encoding.datasets import get_dataset  # PyTorch-Encoding's name, from the one table of old names

    expected = {"ade20k": 150, "pascal_voc": 21, "pascal_aug": 21, "pcontext": 59, "citys": 19, "coco": 21,
                "shapes": 7, "folder": 0}  # folder: the classes are the data's (an instance's CLASSES)
    assert {k: v.NUM_CLASS for k, v in eds.datasets.items()} == expected
    for cls in eds.datasets.values():
        assert len(cls.CLASSES) == cls.NUM_CLASS == len(set(cls.CLASSES))
    assert eds.datasets["shapes"].CLASSES == ("background", "disc", "square", "triangle", "star", "ring", "bar")
    assert get_dataset.__wrapped__ is get_segmentation_dataset  # a thin layer that warns
    with pytest.raises(ValueError, match="unknown dataset 'voc'.*ade20k.*citys.*shapes"):
        get_segmentation_dataset("voc")


def test_palette_comes_from_encoding_utils_palette():
    from encoding.utils.palette import get_palette

    for name, cls in ((n, c) for n, c in eds.datasets.items() if n != "folder"):  # folder: per instance
        assert cls.PALETTE == get_palette(name)
        assert len(cls.PALETTE) >= cls.NUM_CLASS
        assert "PALETTE" in vars(cls) and "IGNORE_COLOR" in vars(cls)  # carried by the dataset class itself
        assert cls.IGNORE_COLOR not in cls.PALETTE
    assert eds.IGNORE_INDEX == -1 and eds.BaseDataset.PALETTE is None


def test_missing_root_and_env_default(tmp_path, monkeypatch):
    monkeypatch.setenv("ENCODING_DATA", str(tmp_path / "env_root"))
    assert eds.default_root() == str(tmp_path / "env_root")
    with pytest.raises(DatasetError, match=r"env_root.*VOC2012.*prepare_pascal\.py.*--data-root"):
        get_segmentation_dataset("pascal_voc")
    make_voc(str(tmp_path / "env_root"))
    assert len(get_segmentation_dataset("pascal_voc")) == 3  # root taken from ENCODING_DATA
    monkeypatch.delenv("ENCODING_DATA")
    assert eds.default_root() == os.path.expanduser("~/.encoding/data")
    with pytest.raises(ValueError, match="unknown split 'bogus'.*train, val"):
        get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="bogus")
    with pytest.raises(ValueError, match="unknown mode 'eval'"):
        get_segmentation_dataset("pascal_voc", root=str(tmp_path / "env_root"), mode="eval")


# ------------------------------------------------------------------------------------------------------ layouts
def _check_testval(ds, index, expected_cls):
    image, mask = ds[index]
    assert image.dtype == torch.float32 and mask.dtype == torch.int64
    assert tuple(image.shape) == (3, *expected_cls.shape) and tuple(mask.shape) == expected_cls.shape
    assert torch.equal(mask, torch.from_numpy(np.asarray(expected_cls, dtype=np.int64)))
    return image, mask


def test_pascal_voc_counts_ignore_and_testval(tmp_path):
    _, ids = make_voc(str(tmp_path))
    train = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="train", mode="testval")
    assert len(train) == 3 and len(get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="val")) == 2
    for i in range(3):
        cls = class_pattern(*SIZES[i], offset=i, ignore_border=True)
        image, mask = _check_testval(train, i, cls)
        assert colour_agreement(image, mask) > 0.99
        assert set(mask.unique().tolist()) <= {-1, 0, 1, 2, 3}


def test_ade20k_shift_and_trainval(tmp_path):
    make_ade(str(tmp_path))
    val = get_segmentation_dataset("ade20k", root=str(tmp_path), split="val", mode="testval")
    assert len(val) == 2 and len(get_segmentation_dataset("ade20k", root=str(tmp_path), split="trainval")) == 4
    expected = class_pattern(*SIZES[0], offset=0, ignore_border=True)
    expected[0, :4] = 149  # raw 150 -> last class; raw 0 -> ignore
    _check_testval(val, 0, expected)
    assert val.pred_offset == 1 and val.num_class == 150
    assert torch.equal(val.make_pred(torch.tensor([0, 149])), torch.tensor([1, 150]))


def test_cityscapes_ids_to_train_ids(tmp_path):
    make_citys(str(tmp_path), "val")
    ds = get_segmentation_dataset("citys", root=str(tmp_path), split="val", mode="testval")
    assert len(ds) == 2 and (ds.base_size, ds.crop_size) == (1024, 768)
    expected = class_pattern(32, 64, offset=0, ignore_border=True)
    expected = np.vectorize(lambda k: {0: 0, 1: 1, 2: 2, 3: 13}.get(int(k), -1))(expected)
    expected[0, :3] = 18
    expected[1, :3] = -1
    _check_testval(ds, 0, expected)


def test_pascal_aug_mat_labels(tmp_path):
    base, ids = make_aug(str(tmp_path))
    with pytest.raises(DatasetError, match=r"cls_png.*python -m encoding\.datasets\.prepare pascal"):
        get_segmentation_dataset("pascal_aug", root=str(tmp_path), split="train")  # loading never converts
    convert_sbd_masks(base, progress=False)  # the prepare step (python -m encoding.datasets.prepare pascal)
    ds = get_segmentation_dataset("pascal_aug", root=str(tmp_path), split="train", mode="testval")
    assert len(ds) == 2
    assert ds.masks == [os.path.join(base, "cls_png", name + ".png") for name in ids]  # converted once, read as PNG
    image, mask = _check_testval(ds, 1, class_pattern(*SIZES[1], offset=1, ignore_border=True))
    assert colour_agreement(image, mask) > 0.99
    os.remove(os.path.join(base, "cls", ids[0] + ".mat"))  # the conversion is not repeated: the .mat is not read
    assert len(get_segmentation_dataset("pascal_aug", root=str(tmp_path), split="train")) == 2


def test_sbd_labels_read_from_scipy_compressed_fixture_and_garbage_rejected(tmp_path):
    # Written by scipy.io.savemat(do_compression=True) in SBD's structure: GTcls.{Boundaries (cell of sparse),
    # Segmentation (uint8), CategoriesPresent}.
    fixture = ("TUFUTEFCIDUuMCBNQVQtZmlsZSBQbGF0Zm9ybTogcG9zaXgsIENyZWF0ZWQgb246IE1vbiBOb3YgMjMgMDc6NDA6MzMgMjAyNgAA"
               "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAABSU0PAAAAwQAAAHichZDdDoIwDIUPkx9N"
               "DDOGB/HKa6MX3proA0h0ARKFBPD5taNDml1ok4a2nJ1vawoKBcT0mXM5ROT6QKSdHS+3RzfUIdZuvqXcN6/6nreV6ZwBzqZ4mrrP"
               "+6qpeXLIe1M0VnNqTUf/aJaCTWLBk3wl+HD6EpM+IkEo9DNwL31WopfzDFME4iyvJERAYXlXj6f+8MZ7j7pMMJRI5iji8Lt2grPw"
               "/HyOPb8cqgQ60Rr6/d3P5oePv0/LTzTwASZnFn0=")
    import base64

    path = tmp_path / "fixture.mat"
    path.write_bytes(base64.b64decode(fixture))
    segmentation = read_sbd_segmentation(str(path))
    assert segmentation.dtype == np.uint8
    assert segmentation.tolist() == [[0, 0, 15, 15], [0, 15, 15, 255], [7, 7, 0, 0]]
    (tmp_path / "bad.mat").write_bytes(b"x" * 200)
    with pytest.raises(DatasetError, match="bad.mat.*cannot read .mat label"):
        read_sbd_segmentation(str(tmp_path / "bad.mat"))
    (tmp_path / "cut.mat").write_bytes(base64.b64decode(fixture)[:200])
    with pytest.raises(DatasetError, match="cut.mat"):
        read_sbd_segmentation(str(tmp_path / "cut.mat"))
    scipy.io.savemat(str(tmp_path / "other.mat"), {"GTinst": {"Segmentation": np.zeros((2, 2))}})
    with pytest.raises(DatasetError, match="other.mat.*GTcls"):
        read_sbd_segmentation(str(tmp_path / "other.mat"))
    with pytest.raises(DatasetError, match="missing"):
        read_sbd_segmentation(str(tmp_path / "absent.mat"))


def test_rle_decoding_matches_pycocotools_strings():
    # Strings produced by pycocotools.mask.encode for known masks.
    small = decode_rle({"size": [5, 6], "counts": "01:2H0004"})
    expected = np.zeros((5, 6), dtype=bool)
    expected[1:4, 2:5] = True
    expected[0, 0] = True
    assert np.array_equal(small, expected)
    big = decode_rle({"size": [40, 50], "counts": "d05S100000000000000000_Of0K000000000000000000000000000000000"
                                                  "0000000000000000000000000000000000a0ZO50000000\\O"})
    expected = np.zeros((40, 50), dtype=bool)
    expected[3:30, 10:45] = True
    expected[20:25, :] = True
    assert np.array_equal(big, expected)
    rng = np.random.default_rng(0)
    mask = rng.random((13, 17)) > 0.5
    assert np.array_equal(decode_rle({"size": [13, 17], "counts": rle_string(mask)}), mask)
    with pytest.raises(ValueError, match="covers"):
        decode_rle({"size": [5, 6], "counts": [3, 4]})


def test_pcontext_conversion_and_mapping(tmp_path):
    voc_root, json_path, expected = make_context(str(tmp_path))
    counts = convert_context_annotations(json_path, voc_root, progress=False)
    assert counts == {"train": 2, "val": 1}
    train = get_segmentation_dataset("pcontext", root=str(tmp_path), split="train", mode="testval")
    assert len(train) == 2 and train.pred_offset == 1
    _check_testval(train, 1, expected["2008_000002"])
    raw = np.array(Image.open(os.path.join(voc_root, "SegmentationClassContext", "2008_000001.png")))
    assert set(np.unique(raw).tolist()) == {0, 1, 59}
    # a second conversion is skipped (existing output kept)
    os.remove(json_path)
    assert convert_context_annotations(json_path, voc_root, progress=False) == counts


def test_pcontext_lists_train_and_val_reports_other_phases_and_refuses_no_phase(tmp_path, capsys):
    """As the Detail API (PyTorch-Encoding's reader): ``train`` and ``val`` images make the two lists; another phase
    (``test``) was left out silently, now in one printed line; an image without a phase went to ``train`` silently
    (the Detail API fails on it), now a DatasetError naming the file and the image."""
    whole = np.ones((4, 4), bool)
    records = [("a.jpg", "train", 4, 4, [(2, whole)]), ("b.jpg", "val", 4, 4, [(2, whole)]),
               ("c.jpg", "test", 4, 4, [(2, whole)]), ("d.jpg", "test", 4, 4, [(2, whole)])]
    json_path, voc = context_json(str(tmp_path / "ok.json"), records), str(tmp_path / "voc")
    capsys.readouterr()
    assert convert_context_annotations(json_path, voc, progress=False) == {"train": 1, "val": 1}
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["PASCAL-Context: left out 2 image(s) of another phase than train / val ('test': 2)"], out
    lists = os.path.join(voc, "ImageSets", "SegmentationContext")
    assert [open(os.path.join(lists, n + ".txt")).read() for n in ("train", "val")] == ["a\n", "b\n"]
    assert sorted(os.listdir(os.path.join(voc, "SegmentationClassContext"))) == ["a.png", "b.png"]
    with open(json_path) as f:
        data = json.load(f)
    del data["images"][1]["phase"]
    with open(json_path, "w") as f:
        json.dump(data, f)
    with pytest.raises(DatasetError, match=r"ok\.json: image 'b\.jpg' has no 'phase'"):
        convert_context_annotations(json_path, str(tmp_path / "voc2"), progress=False)
    assert not os.path.exists(os.path.join(str(tmp_path / "voc2"), "ImageSets"))


def test_coco_masks_built_with_pycocotools_api(tmp_path, fake_pycocotools):
    base = make_coco(str(tmp_path))
    with pytest.raises(DatasetError, match=r"val2017\.txt.*python -m encoding\.datasets\.prepare coco"):
        get_segmentation_dataset("coco", root=str(tmp_path), split="val")  # loading never builds the masks
    build_coco_masks(base, "val", progress=False)  # the prepare step (python -m encoding.datasets.prepare coco)
    ds = get_segmentation_dataset("coco", root=str(tmp_path), split="val", mode="testval")
    assert len(ds) == 1  # image 2 has no VOC category and is dropped
    image, mask = ds[0]
    assert mask.shape == (48, 64)
    assert mask[5, 5] == 12 and mask[5, 30] == 12  # dog painted first keeps the overlap
    assert mask[5, 50] == 15 and mask[44, 5] == 0  # person; the non-VOC stop sign is background
    assert set(mask.unique().tolist()) == {0, 12, 15}


def test_coco_without_pycocotools_is_a_clear_error(tmp_path, monkeypatch):
    base = make_coco(str(tmp_path))
    monkeypatch.setitem(sys.modules, "pycocotools", None)
    monkeypatch.setitem(sys.modules, "pycocotools.coco", None)
    with pytest.raises(ImportError, match="pip install pycocotools"):
        build_coco_masks(base, "val", progress=False)  # the masks are built at prepare time, the one user of it


# --------------------------------------------------------------------------------------------------- transforms
def test_train_mode_keeps_image_and_mask_aligned(tmp_path):
    make_voc(str(tmp_path), ignore_border=False)
    ds = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="train", base_size=64, crop_size=48)
    for seed in range(12):
        torch.manual_seed(seed)
        image, mask = ds[seed % 3]
        assert image.shape == (3, 48, 48) and mask.shape == (48, 48)
        assert colour_agreement(image, mask) > 0.9, seed


def test_train_mode_pads_image_with_zero_and_mask_with_ignore(tmp_path):
    make_voc(str(tmp_path), ignore_border=False)
    ds = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="train", base_size=40, crop_size=96)
    for seed in range(4):
        torch.manual_seed(seed)
        image, mask = ds[0]  # long side <= 80 < 96: the bottom-right corner is always padding
        assert image.shape == (3, 96, 96)
        assert mask[-1, -1] == -1 and torch.all(image[:, -1, -1] == 0)
        padded = (image == 0).all(0)
        assert torch.all(mask[padded] == -1) and padded.any()
        assert (mask >= 0).any()


def test_train_mode_is_deterministic_per_seed_and_varies_across_seeds(tmp_path):
    make_voc(str(tmp_path))
    ds = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="train", base_size=64, crop_size=32,
                                  jitter=0.4)
    torch.manual_seed(7)
    a = ds[1]
    torch.manual_seed(7)
    b = ds[1]
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    others = []
    for seed in range(8, 12):
        torch.manual_seed(seed)
        others.append(ds[1][1])
    assert any(not torch.equal(a[1], m) for m in others)


def test_val_and_test_modes_and_custom_transform(tmp_path):
    make_voc(str(tmp_path))
    val = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="val", crop_size=32)
    assert val.mode == "val"
    image, mask = val[0]
    assert image.shape == (3, 32, 32) and mask.shape == (32, 32)
    assert colour_agreement(image, mask) > 0.9
    whole = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="val", mode="val", val_crop=False)
    assert whole[0][0].shape == (3, *SIZES[0])
    test = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="val", mode="test")
    image, name = test[1]
    assert image.shape == (3, *SIZES[1]) and name == "2007_000001.jpg"
    raw = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="val", mode="testval",
                                   transform=lambda im: im.float(), return_name=True)
    image, mask, name = raw[0]
    assert image.max() > 200 and name == "2007_000000.jpg"  # the transform replaced the normalisation


# ------------------------------------------------------------------------------------------------------ collate
def test_pad_collate_pads_variable_sizes_and_carries_names(tmp_path):
    make_voc(str(tmp_path))
    ds = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="train", mode="testval", return_name=True)
    samples = [ds[i] for i in range(3)]
    images, masks, names = pad_collate(samples)
    assert images.shape == (3, 3, 56, 72) and masks.shape == (3, 56, 72)
    assert list(names) == ["2007_000000.jpg", "2007_000001.jpg", "2007_000002.jpg"]
    try:
        from encoding.parallel import PerSample
    except ImportError:
        PerSample = list
    assert isinstance(names, PerSample)
    for i, (image, mask, _) in enumerate(samples):
        h, w = mask.shape
        assert torch.equal(images[i, :, :h, :w], image) and torch.equal(masks[i, :h, :w], mask)
        assert torch.all(images[i, :, h:, :] == 0) and torch.all(images[i, :, :, w:] == 0)
        assert torch.all(masks[i, h:, :] == -1) and torch.all(masks[i, :, w:] == -1)
    loader = torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=pad_collate)
    first = next(iter(loader))
    assert first[0].shape == (2, 3, 48, 72)
    same = pad_collate([(torch.ones(2, 2), 1), (torch.zeros(2, 2), 2)])
    assert same[0].shape == (2, 2, 2) and same[1].tolist() == [1, 2]


# ---------------------------------------------------------------------------------------------------- bad input
def _voc(tmp_path, **kw):
    return get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="train", mode="testval", **kw)


@pytest.mark.parametrize("case", ["corrupt", "truncated", "size", "range", "rgb"])
def test_bad_samples_raise_naming_the_file_or_are_skipped(tmp_path, case):
    base, ids = make_voc(str(tmp_path))
    image_path = os.path.join(base, "JPEGImages", ids[1] + ".jpg")
    mask_path = os.path.join(base, "SegmentationClass", ids[1] + ".png")
    bad_path, message = {
        "corrupt": (image_path, "cannot decode image"),
        "truncated": (image_path, "cannot decode image"),
        "size": (mask_path, "differs from its image"),
        "range": (mask_path, r"label values \[30\] are outside the 21 classes"),
        "rgb": (mask_path, "mode RGB"),
    }[case]
    if case == "corrupt":
        open(image_path, "wb").write(b"definitely not a JPEG")
    elif case == "truncated":
        data = open(image_path, "rb").read()
        open(image_path, "wb").write(data[: len(data) // 2])
    elif case == "size":
        save_label(mask_path, np.zeros((10, 10)))
    elif case == "range":
        raw = np.array(Image.open(mask_path))
        raw[3, 3] = 30
        save_label(mask_path, raw)
    else:
        Image.new("RGB", SIZES[1][::-1]).save(mask_path)
    ds = _voc(tmp_path)
    with pytest.raises(DatasetError, match=message) as info:
        ds[1]
    assert info.value.path == bad_path and bad_path in str(info.value)
    with pytest.raises(DatasetError, match=message):
        ds.verify()
    with pytest.warns(RuntimeWarning, match="skipping bad sample"):
        scored = _voc(tmp_path, skip_bad=True)  # a scoring mode drops it when built: no sample is scored twice
    assert len(scored) == 2 and scored[1][1].shape == SIZES[2] and scored.num_skipped == 1
    assert scored.skipped[0][0] == bad_path
    skipping = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="train", mode="train",
                                        skip_bad=True, base_size=40, crop_size=16)
    with pytest.warns(RuntimeWarning, match="skipping bad sample"):
        skipping[1]  # training: the next good sample stands in
    assert skipping.num_skipped == 1 and skipping.skipped[0][0] == bad_path and len(skipping) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        skipping[1]  # known bad: no second warning
    assert skipping.num_skipped == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert skipping.verify() == 1  # dropped now: already warned of and counted when it was loaded
    assert len(skipping) == 2 and skipping.num_skipped == 1


def test_missing_mask_and_empty_split(tmp_path):
    base, ids = make_voc(str(tmp_path))
    missing = os.path.join(base, "SegmentationClass", ids[2] + ".png")
    os.remove(missing)
    with pytest.raises(DatasetError, match="mask file is missing") as info:
        _voc(tmp_path)
    assert info.value.path == missing
    with pytest.warns(RuntimeWarning, match=ids[2]):
        ds = _voc(tmp_path, skip_bad=True)
    assert len(ds) == 2 and ds.num_skipped == 1
    split = os.path.join(base, "ImageSets", "Segmentation", "train.txt")
    open(split, "w").write("\n\n")
    with pytest.raises(DatasetError, match="split file is empty") as info:
        _voc(tmp_path)
    assert info.value.path == split


# ----------------------------------------------------------------- the one image reader (issue 24.9): odd images
def test_datasets_read_exif_rotated_and_16_bit_images_as_displayed(tmp_path):
    base, ids = make_voc(str(tmp_path))
    first = os.path.join(base, "JPEGImages", ids[0] + ".jpg")
    displayed = Image.open(first).convert("RGB")
    stored = displayed.transpose(Image.Transpose.ROTATE_90)  # what a phone stores with orientation 6
    exif = stored.getexif()
    exif[0x0112] = 6
    stored.save(first, quality=95, exif=exif.tobytes())
    second = os.path.join(base, "JPEGImages", ids[1] + ".jpg")
    grey = np.asarray(Image.open(second).convert("L"))
    Image.fromarray(grey.astype(np.uint16) * 257).save(second, format="PNG")  # a 16-bit grey scan
    ds = get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="train", mode="testval")
    image, mask = ds[0]  # before: "mask size 72x48 differs from its image"
    assert tuple(image.shape[-2:]) == tuple(mask.shape) == (displayed.height, displayed.width)
    assert colour_agreement(image, mask) > 0.95
    scan, _ = ds[1]
    pixels = (scan * STD + MEAN) * 255.0
    assert float((pixels[0] - torch.from_numpy(grey).float()).abs().max()) < 1.0  # not clipped to white
    assert torch.allclose(pixels[0], pixels[1], atol=1e-3) and torch.allclose(pixels[0], pixels[2], atol=1e-3)


def test_the_reader_scales_16_bit_and_names_a_bad_file(tmp_path):
    from encoding.datasets.base import check_image, read_rgb
    ramp = np.linspace(0, 65535, 4 * 3).reshape(3, 4).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "ramp.png")
    rgb = read_rgb(str(tmp_path / "ramp.png"))
    assert rgb.shape == (3, 4, 3) and rgb.dtype == np.uint8
    np.testing.assert_array_equal(rgb[..., 0], np.rint(ramp / 257.0).astype(np.uint8))
    (tmp_path / "bad.png").write_bytes(b"not a png")
    for reader in (read_rgb, check_image):
        with pytest.raises(DatasetError, match="bad.png.*cannot decode image"):
            reader(str(tmp_path / "bad.png"))


def test_the_test_split_without_masks_is_refused_in_a_scoring_mode(tmp_path):
    """split="test" (images only) with mode="testval" was built, then failed on the first sample with a TypeError."""
    base, ids = make_voc(str(tmp_path))
    write_lines(os.path.join(base, "ImageSets", "Segmentation", "test.txt"), ids)
    with pytest.raises(DatasetError, match=r"split 'test' has no masks for mode 'testval' \(mode='test' predicts\)"):
        get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="test", mode="testval")
    assert len(get_segmentation_dataset("pascal_voc", root=str(tmp_path), split="test", mode="test")) == 3
