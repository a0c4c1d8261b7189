"""The pictures of an evaluation: the confusion matrix, the IoU bars, the error maps and the worst-images gallery
(encoding.inference.evaluation_plots / error_maps), and test.py writing them beside metrics.json."""
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import load_script, tiny_eval_set
from encoding.datasets.shapes import SHAPES_CLASSES, SHAPES_PALETTE
from encoding.datasets.transforms import IMAGENET_MEAN, IMAGENET_STD
from encoding.inference.error_maps import ERROR_COLOURS, WORST_NAME, ErrorMaps, _thumb, error_map, error_panel
from encoding.inference.evaluation_plots import (CONFUSION_NAME, IOU_NAME, confusion_view, iou_order, plot_confusion,
                                              plot_iou)
from encoding.engine.previews import _displayable
from encoding.utils import SegmentationMetric
from encoding.utils.metrics import scores_from_confusion

GREEN, RED, WHITE = (np.array(c) for c in ERROR_COLOURS.values())


def averaged(image, colour):
    return (image.astype(np.int64) + colour + 1) // 2


def test_the_confusion_picture_counts_what_the_metric_counts():
    torch.manual_seed(0)
    labels, target = torch.randint(0, 5, (3, 20, 30)), torch.randint(0, 5, (3, 20, 30))
    target[:, :2] = -1
    metric = SegmentationMetric(5)
    metric.update(labels, target)
    confusion = metric.compute()["confusion"]
    ids, shares = confusion_view(confusion)
    assert ids == list(range(5))
    rows = confusion.sum(1, keepdim=True).double().numpy()
    np.testing.assert_array_equal(np.rint(shares * rows).astype(np.int64), confusion.numpy())
    scored = target != -1  # counted here independently of the metric
    for t in range(5):
        for p in range(5):
            expected = int(((target == t) & (labels == p) & scored).sum())
            assert int(np.rint(shares[t, p] * rows[t, 0])) == expected


def test_150_classes_show_the_30_most_confused(tmp_path):
    n = 150
    confusion = torch.diag(torch.full((n,), 1000, dtype=torch.int64))
    confused = list(range(3, n, 5))[:30]
    for rank, c in enumerate(confused):  # class c: 10 + rank of its pixels predicted as class 0
        confusion[c, c] -= 10 + rank
        confusion[c, 0] += 10 + rank
    ids, shares = confusion_view(confusion, max_classes=30)
    expected = sorted([0] + confused[1:])  # class 0 gathers every confusion; the least confused one drops out
    assert ids == expected and shares.shape == (30, 30)
    row = ids.index(confused[-1])
    assert shares[row, 0] == pytest.approx((10 + 29) / 1000)  # a share of all the class's pixels
    names = [f"class{i}" for i in range(n)]
    path = plot_confusion(confusion, names, str(tmp_path / "c.png"))
    width, height = Image.open(path).size
    assert 500 < width < 1100 and 500 < height < 1100  # 30 readable rows, not 150


def test_iou_bars_go_from_the_worst_class_to_the_best(tmp_path):
    confusion = torch.tensor([[50, 10, 0, 0], [20, 20, 0, 0], [0, 0, 9, 0], [0, 0, 0, 0]])
    result = scores_from_confusion(confusion)
    names = ["a", "b", "c", "d"]
    bars = iou_order(result["IoU"], names)
    assert [name for name, _ in bars] == ["b", "a", "c"]  # d: in neither targets nor predictions
    assert [v for _, v in bars] == pytest.approx([20 / 50, 50 / 80, 1.0])
    path = plot_iou(result, names, str(tmp_path / "iou.png"))
    assert Image.open(path).format == "PNG"


def test_error_map_colours_correct_wrong_and_ignored_pixels():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    target = np.zeros((6, 8), np.int64)
    labels = target.copy()
    labels[1, 2] = 3       # wrong
    target[4, 5] = -1      # ignored (whatever the prediction)
    labels[4, 5] = 2
    drawn = error_map(image, labels, target)
    np.testing.assert_array_equal(drawn[1, 2], averaged(image[1, 2], RED))
    np.testing.assert_array_equal(drawn[4, 5], averaged(image[4, 5], WHITE))
    np.testing.assert_array_equal(drawn[0, 0], averaged(image[0, 0], GREEN))
    assert drawn.dtype == np.uint8 and drawn.shape == image.shape
    panel = np.asarray(error_panel(image, labels, target))
    np.testing.assert_array_equal(panel[:6, :8], image)  # the image beside its error map
    np.testing.assert_array_equal(panel[:6, 8:], drawn)


def normalised(rgb):
    """An ``H x W x 3`` uint8 picture as a dataset image (ImageNet mean / std)."""
    x = torch.tensor(rgb, dtype=torch.float32).permute(2, 0, 1) / 255
    return (x - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_STD).view(3, 1, 1)


def test_error_maps_keep_the_worst_images_for_the_gallery(tmp_path):
    """Three images scored 0, 1/3 and 1: with worst=2 the gallery shows the first two, the lowest first."""
    target = torch.zeros(10, 12, dtype=torch.int64)
    target[:, 6:] = 1
    predictions = {"all_wrong.jpg": 1 - target, "half.jpg": torch.ones_like(target), "right.jpg": target}
    maps = ErrorMaps(str(tmp_path / "errors"), 2, SHAPES_PALETTE, worst=2)
    rgb = {name: np.full((10, 12, 3), 40 * i + 60, np.uint8) for i, name in enumerate(predictions)}
    for name, labels in predictions.items():
        logits = torch.nn.functional.one_hot(labels, 2).permute(2, 0, 1).float().unsqueeze(0)
        maps([logits], ([normalised(rgb[name])], [target], [name]))
    assert [(n, round(m, 4)) for n, m in maps.scores] == [("all_wrong.jpg", 0.0), ("half.jpg", 0.25),
                                                          ("right.jpg", 1.0)]
    assert sorted(os.listdir(tmp_path / "errors")) == ["all_wrong.png", "half.png", "right.png"]
    worst = maps.worst_images()
    assert [(name, miou) for name, miou, _ in worst] == [("all_wrong.jpg", 0.0), ("half.jpg", 0.25)]
    gallery = np.asarray(Image.open(maps.write_gallery(str(tmp_path / WORST_NAME))).convert("RGB"))
    shown = _displayable(normalised(rgb["all_wrong.jpg"]))  # the image as the dataset gives it back
    first_row = gallery[16 + 14:16 + 14 + 160]
    width = _thumb(shown).shape[1]
    np.testing.assert_array_equal(first_row[:, :width], _thumb(shown))
    errors = first_row[:, 3 * width:4 * width]  # every pixel of the first image is wrong: red over it
    assert (errors == averaged(shown[0, 0], RED)).all()
    half = _displayable(normalised(rgb["half.jpg"]))[0, 0]  # half.jpg: class 0 (left) predicted 1, class 1 right
    second = gallery[16 + 2 * 14 + 160:16 + 2 * 14 + 320, 3 * width:4 * width]
    assert (second[:, : width // 2] == averaged(half, RED)).all()
    assert (second[:, width // 2:] == averaged(half, GREEN)).all()


def run_test(*argv, root):
    return load_script("test").main(["--workers", "0", *argv], data=tiny_eval_set(root, "testval"))


def test_test_py_draws_the_evaluation_beside_metrics_json(tiny_run, tmp_path):
    base, checkpoint, _ = tiny_run
    out, preds = tmp_path / "out", tmp_path / "preds"
    result = run_test("--resume", checkpoint, "--out-dir", str(out), "--save-pred", str(preds), root=base)
    assert {CONFUSION_NAME, IOU_NAME, WORST_NAME, "metrics.json"} <= set(os.listdir(out))
    with open(out / "metrics.json") as f:
        assert json.load(f)["protocol"] == "whole images at the training scale"
    data = tiny_eval_set(base, "testval")
    scores = []
    for image, mask, name in data:
        stem = os.path.splitext(os.path.basename(name))[0]
        labels = np.asarray(Image.open(preds / f"{stem}.png"))  # class ids as pixel values
        panel = np.asarray(Image.open(preds / "errors" / f"{stem}.png").convert("RGB"))
        shown, target = _displayable(image), mask.numpy()
        height, width = target.shape
        np.testing.assert_array_equal(panel[:height, width:], error_map(shown, labels, target))
        kinds = {"wrong": (labels != target) & (target != -1), "ignored": target == -1,
                 "correct": (labels == target)}
        assert kinds["wrong"].any() and kinds["ignored"].any()  # the tiny model errs; shapes' outlines are ignored
        for kind, where in kinds.items():
            colour = np.array(ERROR_COLOURS[kind])
            np.testing.assert_array_equal(panel[:height, width:][where], averaged(shown[where], colour))
        metric = SegmentationMetric(len(SHAPES_CLASSES))
        metric.update(torch.from_numpy(labels.astype(np.int64)), mask)
        scores.append((metric.compute()["mIoU"], name))
    metric = SegmentationMetric(len(SHAPES_CLASSES))
    for image, mask, name in data:
        stem = os.path.splitext(os.path.basename(name))[0]
        metric.update(torch.from_numpy(np.asarray(Image.open(preds / f"{stem}.png")).astype(np.int64)), mask)
    torch.testing.assert_close(result["confusion"], metric.compute()["confusion"], rtol=0, atol=0)
    _, shares = confusion_view(result["confusion"])  # what confusion.png draws: the metric's counts, per row
    rows = result["confusion"].sum(1, keepdim=True).double().numpy()
    np.testing.assert_array_equal(np.rint(np.nan_to_num(shares) * rows), metric.compute()["confusion"].numpy())
    # the gallery: every image (5 < 8), the lowest mIoU first: each row starts with that image's thumbnail
    gallery = np.asarray(Image.open(out / WORST_NAME).convert("RGB"))
    assert gallery.shape[0] == 16 + len(data) * (14 + 160)
    by_name = {name: image for image, _, name in data}
    for i, (_, name) in enumerate(sorted(scores, key=lambda s: s[0])):
        thumb = _thumb(_displayable(by_name[name]))
        top = 16 + i * (14 + 160) + 14
        np.testing.assert_array_equal(gallery[top:top + 160, :thumb.shape[1]], thumb)
