"""SegmentationMetric and the PE functional helpers against an independent float64 numpy reference."""
import math

import numpy as np
import pytest
import torch

from encoding.utils import (SegmentationMetric, batch_intersection_union, batch_pix_accuracy, confusion_matrix,
                            format_table, intersection_and_union, pixel_accuracy)


def reference_scores(pred, target, nclass, ignore_index=-1):
    """Per-class loop in float64 numpy: the plain definitions, independent of the bincount implementation."""
    pred = np.asarray(pred).ravel().astype(np.int64)
    target = np.asarray(target).ravel().astype(np.int64)
    keep = target != ignore_index
    pred, target = pred[keep], target[keep]
    iou, acc, dice, tgt_area = [], [], [], []
    for c in range(nclass):
        p, t = pred == c, target == c
        inter, union = float(np.sum(p & t)), float(np.sum(p | t))
        iou.append(inter / union if union else math.nan)
        acc.append(inter / float(t.sum()) if t.sum() else math.nan)
        dice.append(2 * inter / float(p.sum() + t.sum()) if union else math.nan)
        tgt_area.append(float(t.sum()))
    iou, acc, dice, tgt_area = map(np.array, (iou, acc, dice, tgt_area))
    total = float(target.size)
    present = tgt_area > 0
    conf = np.zeros((nclass, nclass), dtype=np.int64)
    np.add.at(conf, (target, pred), 1)
    return {
        "pixAcc": float(np.sum(pred == target)) / total if total else math.nan,
        "mIoU": float(np.nanmean(iou)) if np.any(~np.isnan(iou)) else math.nan,
        "mAcc": float(np.nanmean(acc)) if np.any(~np.isnan(acc)) else math.nan,
        "mDice": float(np.nanmean(dice)) if np.any(~np.isnan(dice)) else math.nan,
        "fwIoU": float(np.sum(tgt_area[present] / total * iou[present])) if total else math.nan,
        "IoU": iou, "Acc": acc, "Dice": dice, "confusion": conf,
    }


def assert_matches(result, ref, tol=1e-12):
    for key in ("pixAcc", "mIoU", "mAcc", "mDice", "fwIoU"):
        a, b = result[key], ref[key]
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol, (key, a, b)
    for key in ("IoU", "Acc", "Dice"):
        np.testing.assert_allclose(result[key].numpy(), ref[key], rtol=0, atol=tol, equal_nan=True)
    np.testing.assert_array_equal(result["confusion"].numpy(), ref["confusion"])


def random_batch(b=3, nclass=6, h=17, w=13, ignore_frac=0.2, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, nclass, h, w, generator=g, dtype=torch.float64)
    target = torch.randint(0, nclass, (b, h, w), generator=g)
    target[torch.rand(b, h, w, generator=g) < ignore_frac] = -1
    return logits, target


def test_logits_with_ignore_match_reference():
    logits, target = random_batch()
    metric = SegmentationMetric(6)
    metric.update(logits, target)
    ref = reference_scores(logits.argmax(1).numpy(), target.numpy(), 6)
    assert_matches(metric.compute(), ref)
    assert metric.get() == (metric.compute()["pixAcc"], metric.compute()["mIoU"])


def test_labels_dict_and_accumulation_match_reference():
    batches = [random_batch(b=2, seed=s) for s in range(3)]
    metric = SegmentationMetric(6)
    for k, (logits, target) in enumerate(batches):
        if k == 0:
            metric.update(logits.argmax(1), target)                   # labels
        elif k == 1:
            metric.update({"out": logits, "aux": logits * 0}, target)  # model output dict
        else:
            metric.update(logits.float(), target.to(torch.int32))     # float32 logits, int32 target
    preds = torch.cat([lg.argmax(1) for lg, _ in batches])
    targets = torch.cat([t for _, t in batches])
    assert_matches(metric.compute(), reference_scores(preds.numpy(), targets.numpy(), 6))


def test_single_image_shapes():
    logits, target = random_batch(b=1)
    metric = SegmentationMetric(6)
    metric.update(logits[0], target[0])  # CxHxW and HxW
    assert_matches(metric.compute(), reference_scores(logits.argmax(1).numpy(), target.numpy(), 6))


@pytest.mark.parametrize("ignore_index", [255, 6, -100])
def test_other_ignore_values_use_the_general_path(ignore_index):
    logits, target = random_batch(seed=4)
    target = target.clone()
    target[target == -1] = ignore_index
    metric = SegmentationMetric(6, ignore_index=ignore_index)
    metric.update(logits, target)
    assert_matches(metric.compute(), reference_scores(logits.argmax(1).numpy(), target.numpy(), 6, ignore_index))


@pytest.mark.parametrize("ignore_index", [0, 2])
def test_an_ignore_index_that_is_a_class_is_refused(ignore_index):
    """An ignored class in [0, nclass) could never be scored: its pixels are never target, its predictions all count
    as false positives, so its IoU read 0 and pulled mIoU down. Refused, in the metric and in confusion_matrix."""
    from encoding.errors import EncodingError

    with pytest.raises(ValueError, match=rf"ignore_index={ignore_index} .*\[0, 3\).*never be scored.*-1 or 255") as err:
        SegmentationMetric(3, ignore_index=ignore_index)
    assert isinstance(err.value, EncodingError) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=rf"ignore_index={ignore_index} "):
        confusion_matrix(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]), nclass=3, ignore_index=ignore_index)
    assert SegmentationMetric(3, ignore_index=3).ignore_index == 3  # just outside the classes: fine


def test_nan_logits_are_refused_not_scored_as_class_0():
    """argmax of an all-NaN pixel is 0 (and a NaN anywhere wins the max): such pixels were scored as ordinary
    predictions. Logits holding NaN are refused, naming how many values are NaN; labels are unaffected."""
    from encoding.errors import EncodingError

    target = torch.tensor([[[0, 1], [2, 1]]])
    logits = torch.zeros(1, 3, 2, 2)
    logits[0, :, 0, 0] = float("nan")  # one all-NaN pixel (3 values) and one NaN logit of another pixel
    logits[0, 2, 1, 1] = float("nan")
    metric = SegmentationMetric(3)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        with pytest.raises(ValueError, match=r"4 of 12 values are NaN") as err:
            metric.update(logits.to(dtype), target)
        assert isinstance(err.value, EncodingError)
    with pytest.raises(ValueError, match=r"4 of 12 values are NaN"):
        metric.update({"out": logits}, target)
    with pytest.raises(ValueError, match=r"4 of 12 values are NaN"):
        confusion_matrix(logits[0], target[0], nclass=3)
    binary = SegmentationMetric(2, binary=True)  # one-channel binary logits: sigmoid(NaN) > t was read as 0
    with pytest.raises(ValueError, match=r"1 of 4 values are NaN"):
        binary.update(logits[:, :1], torch.zeros(1, 2, 2, dtype=torch.long))
    assert metric.confusion is None and binary.confusion is None  # nothing accumulated
    metric.update(torch.nan_to_num(logits), target)  # finite logits and integer labels are scored as before
    metric.update(target.clone(), target)
    assert metric.confusion.sum() == 8


def test_nan_aware_means_differ_from_pe_for_absent_classes():
    pred = torch.tensor([[0, 0, 1, 1]])
    target = torch.tensor([[0, 0, 1, -1]])
    metric = SegmentationMetric(4)  # classes 2 and 3 never appear
    metric.update(pred, target)
    result = metric.compute()
    assert math.isnan(result["IoU"][2]) and math.isnan(result["IoU"][3])
    # class 0: 2/2, class 1: 1 pixel in target, predicted there once (the other prediction is on an ignored pixel)
    assert result["IoU"][:2].tolist() == [1.0, 1.0]
    assert result["mIoU"] == 1.0
    pe_style = float(np.mean(np.nan_to_num(result["IoU"].numpy())))
    assert pe_style == 0.5


def test_predicted_but_absent_class_counts_as_zero_iou():
    metric = SegmentationMetric(3)
    metric.update(torch.tensor([0, 2, 1]), torch.tensor([0, 1, 1]))
    result = metric.compute()
    assert result["IoU"][2] == 0.0 and math.isnan(result["Acc"][2])
    assert abs(result["mIoU"] - (1.0 + 0.5 + 0.0) / 3) < 1e-15


def test_all_ignored_and_empty():
    metric = SegmentationMetric(5)
    pix, miou = metric.get()
    assert math.isnan(pix) and math.isnan(miou)
    metric.update(torch.randn(2, 5, 4, 4), torch.full((2, 4, 4), -1))
    result = metric.compute()
    assert result["confusion"].sum() == 0
    assert all(math.isnan(result[k]) for k in ("pixAcc", "mIoU", "mAcc", "fwIoU", "mDice"))
    metric.update(torch.zeros(0, 5, 4, 4), torch.zeros(0, 4, 4, dtype=torch.long))
    assert metric.compute()["confusion"].sum() == 0


def test_single_class():
    metric = SegmentationMetric(1)
    metric.update(torch.randn(2, 1, 3, 3), torch.tensor([[[0, -1, 0]] * 3] * 2))
    result = metric.compute()
    assert result["pixAcc"] == 1.0 and result["mIoU"] == 1.0 and result["confusion"].item() == 12


def test_reset():
    metric = SegmentationMetric(3)
    metric.update(torch.tensor([0, 1]), torch.tensor([1, 1]))
    metric.reset()
    metric.update(torch.tensor([2]), torch.tensor([2]))
    assert metric.compute()["confusion"].sum() == 1 and metric.get()[0] == 1.0


def test_invalid_target_values_are_named():
    metric = SegmentationMetric(4)
    target = torch.tensor([[0, 1, 7, -3, -1, 9]])
    with pytest.raises(ValueError, match=r"-3, 7, 9"):
        metric.update(torch.zeros(1, 6, dtype=torch.long), target)
    with pytest.raises(ValueError, match=r"\b4\b"):  # just past the range, no ignore present (fast path check)
        metric.update(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match=r"ignore_index=255.*-1"):
        SegmentationMetric(4, ignore_index=255).update(torch.zeros(1, 2, dtype=torch.long), torch.tensor([[-1, 255]]))
    assert metric.confusion is None  # nothing was accumulated by the failed updates


def test_invalid_predictions_and_shapes():
    metric = SegmentationMetric(4)
    with pytest.raises(ValueError, match=r"predicted labels .* 5"):
        metric.update(torch.tensor([[0, 5]]), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="3 channels"):
        metric.update(torch.randn(2, 3, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="do not match"):
        metric.update(torch.randn(2, 4, 5, 4), torch.zeros(2, 4, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="argument order"):  # not PE's order beyond doubt (that one is swapped)
        metric.update(torch.zeros(2, 4, 4, dtype=torch.long), torch.randn(2, 4, 4, 5))
    with pytest.raises(TypeError, match="integer labels"):
        metric.update(torch.zeros(2, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long))
    with pytest.raises(KeyError, match="'out'"):
        metric.update({"aux": torch.randn(1, 4, 2, 2)}, torch.zeros(1, 2, 2, dtype=torch.long))


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.8])
def test_integer_labels_with_a_kept_class_dimension_are_refused_not_read_as_logits(threshold):
    """argmax(1, keepdim=True) labels with nclass=2 were taken for one binary logit channel (sigmoid(label) >
    threshold): right at 0.5 by luck, wrong at other thresholds. They are refused, naming the fix."""
    target = torch.tensor([[[0, 1], [1, 0]]])
    labels = target.unsqueeze(1)  # 1 x 1 x 2 x 2 integers
    for metric in (SegmentationMetric(2, binary=True, threshold=threshold), SegmentationMetric(2)):
        with pytest.raises(TypeError, match=r"with a class dimension must be logits, got dtype torch.int64; pass "
                                            r"integer labels shaped like the target \(1, 2, 2\)"):
            metric.update(labels, target)
        metric.update(labels[:, 0], target)
        assert metric.get()[0] == 1.0
    with pytest.raises(TypeError, match="must be logits"):
        confusion_matrix(labels, target, 2)


def test_replica_list_with_full_and_per_replica_targets():
    logits, target = random_batch(b=7, seed=7)
    chunks = list(torch.split(logits, [3, 3, 1]))
    whole = SegmentationMetric(6)
    whole.update(logits, target)
    split_full = SegmentationMetric(6)
    split_full.update([chunks[0], {"out": chunks[1]}, (chunks[2], None)], target)
    split_list = SegmentationMetric(6)
    split_list.update(chunks, list(torch.split(target, [3, 3, 1])))
    assert torch.equal(split_full.compute()["confusion"], whole.compute()["confusion"])
    assert torch.equal(split_list.compute()["confusion"], whole.compute()["confusion"])
    with pytest.raises(ValueError, match=r"\[3, 3, 1\].*8"):
        split_full.update(chunks, torch.cat([target, target[:1]]))
    with pytest.raises(ValueError, match="3 replica outputs but 2 targets"):
        split_full.update(chunks, [target, target])
    with pytest.raises(ValueError, match="empty"):
        split_full.update([], target)


def test_out_aux_tuple_is_named_in_the_error():
    """PE reads a tuple as one output per replica; a network's (out, aux) tuple gets an error that says so."""
    out = torch.randn(2, 3, 4, 4)
    metric = SegmentationMetric(3)
    with pytest.raises(ValueError, match=r"one output per replica.*\[2, 2\].*2 samples.*\(out, aux\)"):
        metric.update((out, out), torch.zeros(2, 4, 4, dtype=torch.long))
    assert metric.confusion is None


@pytest.mark.gpu
def test_replicas_on_different_devices_stay_there():
    logits, target = random_batch(b=5, seed=3)
    whole = SegmentationMetric(6)
    whole.update(logits, target)
    metric = SegmentationMetric(6)
    metric.update([logits[:3].cuda(), logits[3:]], target)  # the full CPU target is split and moved per replica
    assert metric.confusion.device.type == "cuda"  # lives where the first predictions were
    assert torch.equal(metric.compute()["confusion"], whole.compute()["confusion"])
    on_cpu = SegmentationMetric(6, device="cpu")
    on_cpu.update(logits.cuda(), target.cuda())
    assert on_cpu.confusion.device.type == "cpu"
    assert torch.equal(on_cpu.compute()["confusion"], whole.compute()["confusion"])


def test_confusion_matrix_function_orientation():
    conf = confusion_matrix(torch.tensor([1, 1, 0, 2]), torch.tensor([0, 1, 0, -1]), nclass=3)
    assert conf.tolist() == [[1, 1, 0], [0, 1, 0], [0, 0, 0]]  # rows target, columns prediction


def test_reduce_without_distributed_is_identity():
    metric = SegmentationMetric(3)
    metric.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1]))
    before = metric.confusion.clone()
    metric.reduce_from_all_processes()
    assert torch.equal(metric.confusion, before)
    empty = SegmentationMetric(3)
    empty.reduce_from_all_processes()
    assert empty.confusion.sum() == 0


def test_reduce_twice_does_not_sum_twice(monkeypatch):
    """A second reduction reduces the same local counts; batches after a reduction are counted once each."""
    import encoding.utils.metrics as metrics_module
    world = 2  # every rank holds the same counts: the all-reduce doubles them
    monkeypatch.setattr(metrics_module, "reduce_across_processes", lambda t: t * world)
    first, second = (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 1])), (torch.tensor([2, 2]), torch.tensor([2, 0]))
    metric, local = SegmentationMetric(3), SegmentationMetric(3)
    metric.update(*first)
    local.update(*first)
    metric.reduce_from_all_processes()
    metric.reduce_from_all_processes()
    assert torch.equal(metric.confusion, local.confusion * world)
    metric.update(*second)
    local.update(*second)
    assert torch.equal(metric.confusion, local.confusion)  # this process's own counts again
    metric.reduce_from_all_processes()
    assert torch.equal(metric.confusion, local.confusion * world)
    metric.reset()
    metric.reduce_from_all_processes()
    assert metric.confusion.sum() == 0


def test_pe_batch_helpers_match_reference():
    logits, target = random_batch(b=2, nclass=5, seed=11)
    pred = logits.argmax(1).numpy()
    correct, labeled = batch_pix_accuracy(logits, target)
    t = target.numpy()
    assert labeled == int(np.sum(t >= 0)) and correct == int(np.sum((pred == t) & (t >= 0)))
    inter, union = batch_intersection_union(logits, target, 5)
    ref = reference_scores(pred, t, 5)
    valid = t >= 0
    for c in range(5):
        assert inter[c] == np.sum((pred == c) & (t == c))
        assert union[c] == np.sum(((pred == c) | (t == c)) & valid)
    np.testing.assert_allclose(inter / np.maximum(union, 1), np.nan_to_num(ref["IoU"]), atol=1e-12)
    metric = SegmentationMetric(5)
    metric.update(logits, target)
    assert abs(correct / labeled - metric.get()[0]) < 1e-12


def test_pe_pixel_accuracy_of_labels_checks_what_it_can():
    """Labels give no class count: a 255 (VOC's unlabeled value) counted as a labeled, wrong pixel is said aloud;
    with nclass it is refused as with logits; values below -1 are refused either way."""
    target = torch.tensor([[[0, 1, 255, 255, -1]]])
    labels = torch.tensor([[[0, 1, 1, 1, 0]]])
    with pytest.warns(UserWarning, match="255 .*map it to -1, or pass nclass"):
        assert batch_pix_accuracy(labels, target) == (2, 4)
    with pytest.raises(ValueError, match="got 255"):
        batch_pix_accuracy(labels, target, nclass=2)
    target[0, 0, 2:4] = -1
    assert batch_pix_accuracy(labels, target, nclass=2) == batch_pix_accuracy(labels, target) == (2, 2)
    target[0, 0, 2] = -5
    with pytest.raises(ValueError, match="got -5"):
        batch_pix_accuracy(labels, target)


def test_csail_style_helpers():
    rng = np.random.default_rng(5)
    lab = rng.integers(0, 5, size=(9, 11))    # 0 = unlabeled, classes 1..4 (num_class=5 counts the 0)
    pred = rng.integers(0, 7, size=(9, 11))   # values 5 and 6 are outside the classes and are dropped
    correct, labeled = pixel_accuracy(pred, lab)
    assert labeled == np.sum(lab > 0) and correct == np.sum((pred == lab) & (lab > 0))
    inter, union = intersection_and_union(pred, lab, 5)
    assert inter.shape == union.shape == (4,)
    for k, c in enumerate(range(1, 5)):
        p, t = (pred == c) & (lab > 0), lab == c
        assert inter[k] == np.sum(p & t) and union[k] == np.sum(p | t)


def test_format_table():
    metric = SegmentationMetric(3)
    metric.update(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 1]))
    table = format_table(metric.compute(), ["background", "disc", "square"])
    lines = table.splitlines()
    assert lines[0].split() == ["class", "IoU", "Acc"]
    assert lines[2].split() == ["background", "50.00", "100.00"]
    assert lines[3].split() == ["disc", "50.00", "50.00"]
    assert lines[4].split() == ["square", "-", "-"]
    assert "pixAcc 66.67" in lines[-1] and "mIoU 50.00" in lines[-1]
    with pytest.raises(ValueError, match="2 entries but the result has 3"):
        format_table(metric.compute(), ["a", "b"])
    from encoding.utils.table import scores_to_json  # metrics.json: cut to the shorter list before
    assert list(scores_to_json(metric.compute(), ["a", "b", "c"])["per_class"]) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="2 entries but the result has 3"):
        scores_to_json(metric.compute(), ["a", "b"])


def test_utils_exports_resolve():
    import encoding.utils as utils

    assert len(utils.__all__) == len(set(utils.__all__))
    assert all(hasattr(utils, name) for name in utils.__all__)
    # issue 10 item 8: the package exports what users call; every submodule name still resolves in its submodule
    for module in (utils.files, utils.checkpoint, utils.dist, utils.logger, utils.lr_scheduler, utils.metrics,
                   utils.palette):
        assert all(hasattr(module, name) for name in module.__all__)
    assert all(hasattr(utils, name) for name in ("download", "mkdir", "check_sha1"))  # PE file helpers (aliases)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_class_argmax_is_argmax_with_ties_nans_and_strided_logits(dtype):
    from encoding.utils.metrics import class_argmax, labels_of
    logits = torch.randint(0, 3, (2, 6, 40, 30), generator=torch.Generator().manual_seed(0)).to(dtype)  # many ties
    logits[0, 3, 5, 5] = logits[1, 0, 7, 7] = logits[1, 4, 7, 7] = float("nan")
    for view in (logits, logits[:, :, ::2, 1:], logits.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)):
        assert torch.equal(class_argmax(view, 1), view.argmax(1))
        assert torch.equal(labels_of(view), view.argmax(1))
    assert class_argmax(logits, 1)[0, 5, 5] == 3 and class_argmax(logits, 1)[1, 7, 7] == 0  # the first NaN
    assert torch.equal(class_argmax(logits[0], 0), logits[0].argmax(0)) and class_argmax(logits, 1).dtype == torch.int64
