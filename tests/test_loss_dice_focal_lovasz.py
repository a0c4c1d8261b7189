"""Dice / Focal / Lovász-Softmax (``encoding.nn.loss``): agreement with segmentation_models_pytorch, exact reduction
under DataParallelCriterion (float64, 3 CPU replicas, 3/2/2 split; value and gradients), StatisticsTerm, the old path
``encoding.nn.losses``, and class weights from label frequencies (``--class-weights``) on the tiny shapes data."""
import json
import os
import warnings

import numpy as np
import pytest
import segmentation_models_pytorch as smp
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Subset

from conftest import TINY, TwoHeadNet, assert_replicated_step_is_exact, load_script, tiny_shapes_pair, uneven_batch
from encoding.engine.builders import build_criterion
from encoding.datasets import class_weights as cw
from encoding.datasets.layout import DatasetError
from encoding.engine.assemble import TrainingConfig, build_training
from encoding.nn import LOSSES, DiceLoss, FocalLoss, LovaszSoftmaxLoss
from encoding.nn import loss as core_loss
from encoding.nn.loss import lovasz_softmax_flat
from encoding.parallel import DataParallelCriterion, DataParallelModel, LossTerm, reduce_loss_terms
from encoding.parallel.reduction import StatisticsTerm

NCLASS = 5
DEVICES = ["cpu"] * 3


def _logits_target(dtype=torch.float64, seed=0, batch=3, size=7, all_valid_images=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, NCLASS, size, size, generator=g, dtype=dtype).requires_grad_()
    target = torch.randint(0, NCLASS - 1, (batch, size, size), generator=g)  # class NCLASS-1 absent
    target[torch.rand(batch, size, size, generator=g) < 0.3] = -1
    if all_valid_images:
        target[:, 0, 0] = 0
    return x, target


def _value_and_grad(criterion, x, target):
    loss = criterion(x, target)
    grad, = torch.autograd.grad(loss, x)
    return loss, grad


WEIGHTS = [0.5, 1.0, 2.0, 0.25, 3.0]


@pytest.mark.parametrize("ours, theirs", [
    (DiceLoss(), smp.losses.DiceLoss("multiclass", ignore_index=-1)),
    (DiceLoss(smooth=1.0), smp.losses.DiceLoss("multiclass", ignore_index=-1, smooth=1.0)),
    (DiceLoss(log_loss=True, eps=1e-5), smp.losses.DiceLoss("multiclass", ignore_index=-1, log_loss=True, eps=1e-5)),
    (DiceLoss(weight=torch.tensor(WEIGHTS)),
     smp.losses.DiceLoss("multiclass", ignore_index=-1, class_weights=WEIGHTS)),
    (FocalLoss(activation="sigmoid"), smp.losses.FocalLoss("multiclass", ignore_index=-1)),
    (FocalLoss(activation="sigmoid", alpha=0.25, gamma=0.5),
     smp.losses.FocalLoss("multiclass", ignore_index=-1, alpha=0.25, gamma=0.5)),
    (FocalLoss(activation="sigmoid", weight=torch.tensor(WEIGHTS)),
     smp.losses.FocalLoss("multiclass", ignore_index=-1, class_weights=WEIGHTS)),
], ids=["dice", "dice-smooth", "dice-log", "dice-weighted", "focal-sigmoid", "focal-alpha", "focal-weighted"])
def test_agrees_with_smp_float64(ours, theirs):
    x, target = _logits_target()
    got, got_grad = _value_and_grad(ours, x, target)
    want, want_grad = _value_and_grad(theirs, x, target)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("per_image", [False, True])
def test_lovasz_agrees_with_smp(per_image):
    """smp's Lovász casts the Jaccard gradient to float32 (it fails on float64 input): compared in float32."""
    x, target = _logits_target(dtype=torch.float32)
    got, got_grad = _value_and_grad(LovaszSoftmaxLoss(per_image=per_image), x, target)
    want, want_grad = _value_and_grad(smp.losses.LovaszLoss("multiclass", ignore_index=-1, per_image=per_image),
                                      x, target)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-6)


def test_softmax_focal_formula_and_cross_entropy_at_gamma_zero():
    x, target = _logits_target()
    weight = torch.tensor(WEIGHTS, dtype=torch.float64)
    ce = F.cross_entropy(x, target, weight=weight, ignore_index=-1)
    torch.testing.assert_close(FocalLoss(gamma=0.0, weight=weight)(x, target), ce, rtol=0, atol=1e-12)
    valid = target != -1
    p = x.softmax(1).movedim(1, -1)[valid]                   # P x C
    p_y = p[torch.arange(len(p)), target[valid]]
    w_y = weight[target[valid]]
    want = (w_y * -(1 - p_y) ** 2 * torch.log(p_y)).sum() / w_y.sum()
    torch.testing.assert_close(FocalLoss(gamma=2.0, weight=weight)(x, target), want, rtol=0, atol=1e-12)


def test_weighted_lovasz_is_the_weighted_mean_of_present_class_losses():
    x, target = _logits_target()
    valid = target != -1
    prob, labels = x.softmax(1).movedim(1, -1)[valid], target[valid]
    weight = torch.tensor(WEIGHTS, dtype=torch.float64)
    eye = torch.eye(NCLASS, dtype=torch.float64)
    per_class = torch.stack([lovasz_softmax_flat(prob, labels, weight=eye[c]) for c in range(NCLASS)])
    present = torch.bincount(labels, minlength=NCLASS) > 0
    assert not present[-1] and per_class[-1] == 0
    want = (per_class * weight * present).sum() / (weight * present).sum()
    torch.testing.assert_close(LovaszSoftmaxLoss(weight=weight)(x, target), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(LovaszSoftmaxLoss()(x, target), per_class[present].mean(), rtol=0, atol=1e-12)


def test_empty_and_all_ignored_inputs_give_zero_lovasz_and_nan_free_dice():
    x = torch.randn(2, NCLASS, 4, 4, dtype=torch.float64, requires_grad=True)
    target = torch.full((2, 4, 4), -1)
    loss = LovaszSoftmaxLoss()(x, target)
    assert loss.item() == 0.0
    loss.backward()
    assert x.grad.abs().sum() == 0
    assert DiceLoss()(x, target).item() == 0.0  # no class present: every class loss is zeroed, as smp


def _uneven_batch(seed=0):
    x, target = uneven_batch(NCLASS, seed)  # replica 0 mostly ignored
    target[4][target[4] == 2] = 3  # class 2 only in some replicas
    target[5:][target[5:] == 2] = 1
    return x, target


CLASS_WEIGHTS = torch.tensor([0.2, 1.5, 3.0, 0.7, 1.1], dtype=torch.float64)
EXACT_CASES = {
    "dice": DiceLoss(aux=True, aux_weight=0.4),
    "dice-log-weighted": DiceLoss(aux=True, log_loss=True, smooth=0.5, weight=CLASS_WEIGHTS),
    "focal": FocalLoss(aux=True, weight=CLASS_WEIGHTS),
    "focal-sigmoid": FocalLoss(aux=True, activation="sigmoid", alpha=0.25, weight=CLASS_WEIGHTS),
    "lovasz": LovaszSoftmaxLoss(aux=True),
    "lovasz-weighted": LovaszSoftmaxLoss(aux=True, weight=CLASS_WEIGHTS),
    "lovasz-per-image": LovaszSoftmaxLoss(aux=True, per_image=True),
}


@pytest.mark.parametrize("name", list(EXACT_CASES))
def test_data_parallel_criterion_is_exact(name):
    """3 replicas, 3/2/2 split, uneven ignore masks: the loss and the parameter gradients equal the whole batch's."""
    torch.manual_seed(0)
    net = TwoHeadNet(NCLASS).double()
    x, target = _uneven_batch()
    # the per-replica mean that PyTorch-Encoding took is visibly different
    assert_replicated_step_is_exact(net, net, EXACT_CASES[name], x, target, DEVICES, [3, 2, 2], atol=1e-12, rtol=0,
                                    grad_rtol=0, grad_atol=1e-12, naive_gap=1e-3)


def test_output_key_and_aux_weight_of_the_wrapper_reduce_statistics_terms_exactly():
    torch.manual_seed(0)
    net = TwoHeadNet(NCLASS).double()
    x, target = _uneven_batch(1)
    dice = DiceLoss()
    output = net(x)
    single = dice(output["out"], target) + 0.5 * dice(output["aux"], target)
    wrapped = DataParallelCriterion(dice, DEVICES, output_key="out", aux_weight=0.5)
    torch.testing.assert_close(wrapped(DataParallelModel(net, DEVICES)(x), target), single, rtol=0, atol=1e-12)


def test_statistics_terms_sum_or_concatenate_then_finish():
    mean_ratio = lambda a, b: a.sum() / b.sum()  # noqa: E731
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    parts = [[StatisticsTerm((x[:2] * 2, torch.tensor([1.0, 1.0])), mean_ratio, 0.5, "cat"), LossTerm(x[0], 1)],
             [StatisticsTerm((x[2:] * 2, torch.tensor([2.0])), mean_ratio, 0.5, "cat"), LossTerm(x[2], 3)]]
    loss = reduce_loss_terms(parts)
    assert loss.item() == pytest.approx(0.5 * 12 / 4 + 4 / 4)
    loss.backward()
    assert x.grad.tolist() == pytest.approx([0.25 + 0.25, 0.25, 0.25 + 0.25])
    summed = [[StatisticsTerm((torch.tensor([1.0, 2.0]),), torch.max)], [StatisticsTerm((torch.tensor([3.0, 0.0]),),
                                                                                         torch.max)]]
    assert reduce_loss_terms(summed).item() == 4.0  # max of the elementwise sum (4, 2), not of the parts
    with pytest.raises(ValueError, match="LossTerm on some replicas"):
        reduce_loss_terms([[LossTerm(x[0], 1)], [StatisticsTerm((x,), torch.sum)]])
    with pytest.raises(ValueError, match="combine must be"):
        reduce_loss_terms([[StatisticsTerm((x,), torch.sum, 1.0, "mean")]])


def test_constructors_validate():
    with pytest.raises(ValueError, match="label_smoothing"):
        DiceLoss(label_smoothing=0.1)
    with pytest.raises(ValueError, match="alpha"):
        FocalLoss(alpha=0.25)
    with pytest.raises(ValueError, match="gamma"):
        FocalLoss(gamma=-1)
    with pytest.raises(ValueError, match="unknown loss 'tversky'"):
        build_criterion(NCLASS, loss="tversky")
    assert set(LOSSES) == {"ce", "ohem", "dice", "focal", "lovasz"}
    assert type(build_criterion(NCLASS, loss="ce")) is core_loss.SegmentationLosses


def test_old_module_path_serves_the_same_losses_and_warns_naming_the_new_one():
    """``encoding.nn.losses`` (the old module of Dice / Focal / Lovász and LOSSES) still imports; each class is a thin
    subclass and each function a wrapper that warns naming ``encoding.nn.loss``'s spelling; LOSSES is the registry."""
    import encoding.nn.losses as old
    from encoding import legacy
    from encoding.legacy.declare import old_module

    assert old.LOSSES is LOSSES and set(old.__all__) == set(legacy.ALIASES["encoding.nn.losses"]) == set(
        core_loss.__all__)
    assert old.DiceLoss.__mro__[1] is DiceLoss and old.lovasz_softmax_flat.__wrapped__ is lovasz_softmax_flat
    x, target = _logits_target()
    prob, labels = x.detach().softmax(1).movedim(1, -1).reshape(-1, NCLASS), target.reshape(-1).clamp_min(0)
    uses = {"DiceLoss": (lambda: old.DiceLoss()(x, target), lambda: DiceLoss()(x, target)),
            "SegmentationLosses": (lambda: old.SegmentationLosses()(x, target),
                                   lambda: core_loss.SegmentationLosses()(x, target)),
            "lovasz_softmax_flat": (lambda: old.lovasz_softmax_flat(prob, labels),
                                    lambda: lovasz_softmax_flat(prob, labels))}
    for name, (by_old, by_new) in uses.items():
        with pytest.warns(FutureWarning, match=rf"encoding\.nn\.losses\.{name} is an old name.*; use "
                                               rf"encoding\.nn\.loss\.{name}$"):
            value = by_old()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the new path does not warn
            torch.testing.assert_close(value, by_new(), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="encoding.nn.losses is already a module"):  # declared once
        old_module("encoding.nn.losses", "encoding.nn.loss")
    with pytest.raises(RuntimeError, match="encoding.nn.loss is already a module"):  # never hides a core module
        old_module("encoding.nn.loss", "encoding.nn.binary")


# -- class weights from label frequencies ------------------------------------------------------------------------
def _direct_counts(dataset):
    """Per-class pixels and per-class valid pixels of the images holding the class, read with PIL directly."""
    pixels, image_pixels = np.zeros(dataset.NUM_CLASS), np.zeros(dataset.NUM_CLASS)
    for path in dataset.masks:
        mask = np.array(Image.open(path)).ravel()
        for c in range(dataset.NUM_CLASS):
            n = (mask == c).sum()
            pixels[c] += n
            image_pixels[c] += (mask < dataset.NUM_CLASS).sum() if n else 0
    return pixels, image_pixels


@pytest.fixture
def fresh_shapes(tmp_path):
    """A private copy of the tiny shapes data (the tests touch its masks and its cache)."""
    return tiny_shapes_pair(tmp_path, num_train=6, num_val=2)


def test_class_weights_match_a_direct_computation_and_are_cached(fresh_shapes, monkeypatch):
    train = fresh_shapes[0]
    pixels, image_pixels = _direct_counts(train)
    p = pixels / pixels.sum()
    enet = cw.resolve_class_weights("auto", train, train.NUM_CLASS, progress=False)
    np.testing.assert_allclose(enet.numpy(), 1 / np.log(1.02 + p), rtol=1e-12)
    freq = pixels / np.maximum(image_pixels, 1)
    median = np.median(freq[pixels > 0]) if (pixels > 0).sum() % 2 else np.sort(freq[pixels > 0])[
        (pixels > 0).sum() // 2 - 1]  # torch's median: the lower of the two middle values
    want = np.where(pixels > 0, median / np.maximum(freq, 1e-300), 0)
    np.testing.assert_allclose(cw.resolve_class_weights("median", train, train.NUM_CLASS, progress=False).numpy(),
                               want, rtol=1e-12)
    cache = os.path.join(train.dataset_dir, cw.CACHE_FILE)
    assert os.path.isfile(cache)
    monkeypatch.setattr(type(train), "label_map", lambda self, i: pytest.fail("the cache was not used"))
    hit = cw.label_counts(train, progress=False)
    assert hit["cached"] and hit["pixels"] == pixels.astype(int).tolist()
    assert json.load(open(cache))[f"shapes/train/{len(train)}"]["root"] == train.root


def test_changed_masks_and_other_sample_lists_are_counted_again(fresh_shapes):
    train = fresh_shapes[0]
    first = cw.label_counts(train, progress=False)
    assert not first["cached"] and cw.label_counts(train, progress=False)["cached"]
    subset = cw.label_counts(Subset(train, [0, 1]), progress=False)  # another sample count: its own entry
    assert not subset["cached"] and subset["samples"] == 2
    assert cw.label_counts(train, progress=False)["cached"]
    Image.fromarray(np.zeros((20, 30), dtype=np.uint8)).save(train.masks[0])  # the data changes
    changed = cw.label_counts(train, progress=False)
    assert not changed["cached"] and changed["fingerprint"] != first["fingerprint"]
    assert sum(changed["pixels"]) != sum(first["pixels"])


def test_class_weight_files_and_their_errors(tmp_path):
    (tmp_path / "w.json").write_text("[1, 2.5, 3, 0, 1]")
    (tmp_path / "w.txt").write_text("1 2.5\n3, 0 1\n")
    for name in ("w.json", "w.txt"):
        got = cw.resolve_class_weights(str(tmp_path / name), None, 5)
        assert got.tolist() == [1, 2.5, 3, 0, 1]
    with pytest.raises(DatasetError, match=r"w.json: holds 5 class weights; the dataset has 4 classes"):
        cw.resolve_class_weights(str(tmp_path / "w.json"), None, 4)
    with pytest.raises(DatasetError, match="missing.json: not auto/enet/median nor a readable list"):
        cw.resolve_class_weights(str(tmp_path / "missing.json"), None, 5)
    (tmp_path / "bad.txt").write_text("1 -2 nan")
    with pytest.raises(DatasetError, match=r"bad.txt: class weights must be finite and >= 0"):
        cw.resolve_class_weights(str(tmp_path / "bad.txt"), None, 3)
    with pytest.raises(ValueError, match="needs the training dataset"):
        cw.resolve_class_weights("auto", None, 5)


def test_a_bad_class_weight_file_is_one_line_from_train_py(tmp_path, capsys):
    datasets = tiny_shapes_pair(tmp_path / "data", num_train=6, num_val=2)
    (tmp_path / "w.txt").write_text("1 2 3")
    try:  # refused while the options are parsed (argparse's exit) or when the run starts: one line either way
        status = load_script("train").cli(TINY + ["--output-dir", str(tmp_path / "runs"), "--class-weights",
                                                  str(tmp_path / "w.txt")], datasets=datasets)
    except SystemExit as stop:
        status = stop.code
    err = capsys.readouterr().err.strip()
    assert status != 0 and "w.txt: holds 3 class weights; the dataset has 7 classes" in err and "\n" not in err


@pytest.mark.parametrize("loss", ["dice", "focal", "lovasz"])
def test_auto_weighted_losses_are_exact_across_replicas(fresh_shapes, loss):
    train = fresh_shapes[0]
    weight = cw.resolve_class_weights("auto", train, train.NUM_CLASS, progress=False)
    criterion = build_criterion(train.NUM_CLASS, loss=loss, aux=True, class_weights="auto", train_dataset=train)
    torch.testing.assert_close(criterion.weight, weight.float())
    criterion = criterion.double()
    masks = torch.stack([torch.as_tensor(train.label_map(i)[:16, :16], dtype=torch.int64) for i in range(6)])
    target = torch.cat([masks, masks[:1]]).masked_fill(torch.cat([masks, masks[:1]]) == 255, -1)
    g = torch.Generator().manual_seed(0)
    output = {"out": torch.randn(7, train.NUM_CLASS, 16, 16, generator=g, dtype=torch.float64),
              "aux": torch.randn(7, train.NUM_CLASS, 16, 16, generator=g, dtype=torch.float64)}
    single = criterion(output, target)
    parts = [{k: v[s] for k, v in output.items()} for s in (slice(0, 3), slice(3, 5), slice(5, 7))]
    loss_dp = DataParallelCriterion(criterion, DEVICES)(parts, target)
    torch.testing.assert_close(loss_dp, single, rtol=0, atol=1e-12)


def test_train_options_reach_the_criterion(tmp_path):
    datasets = tiny_shapes_pair(tmp_path / "data", num_train=6, num_val=2)
    script = load_script("train")
    with pytest.raises(SystemExit):
        script.parse_args(["--loss", "hinge"])
    options = script.parse_args(TINY + ["--output-dir", str(tmp_path / "runs"), "--loss", "dice",
                                        "--class-weights", "median", "--device-ids", "cpu,cpu,cpu"])
    run = build_training(TrainingConfig(**vars(options)), datasets=datasets)
    criterion = run.criterion.criterion
    assert isinstance(criterion, DiceLoss)
    torch.testing.assert_close(criterion.weight, cw.class_weights(cw.label_counts(datasets[0]), "median").float())
    # batch Lovász ships ignored pixels masked (no data-dependent shape): the memory planner's fake tensors run it
    script.main(TINY + ["--output-dir", str(tmp_path / "runs2"), "--loss", "lovasz", "--class-weights", "auto",
                        "--device-ids", "cpu,cpu,cpu", "--balance", "memory"], datasets=datasets)
    with open(tmp_path / "runs2" / "shapes" / "unet" / "default" / "log.jsonl") as f:
        row = json.loads(f.readline())
    assert 0 < row["loss"] < 1  # a Lovász-Softmax loss (a surrogate of 1 - IoU), not a cross-entropy
