"""More of PyTorch-Encoding's ``encoding.utils`` names (``accuracy``, ``get_pixacc_miou``, ``get_selabel_vector``,
``MixUpWrapper``, ``torch_dist_sum``, ``load_image``, ``LR_Scheduler`` without ``iters_per_epoch``), each checked
against the plain computation of PE's definition (float64 / numpy) on CPU.
"""
import json
import os
import socket
import warnings

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from PIL import Image

import encoding
from encoding import legacy
from encoding.datasets import DatasetError
from encoding.utils import (LR_Scheduler, MixUpWrapper, accuracy, get_pixacc_miou, get_selabel_vector, load_image,
                            torch_dist_sum)

MEAN = np.array([0.485, 0.456, 0.406])
STD = np.array([0.229, 0.224, 0.225])


def test_the_names_are_bound_where_pe_exported_them():
    for name in ("accuracy", "get_pixacc_miou", "MixUpWrapper", "get_selabel_vector", "torch_dist_sum", "load_image"):
        assert getattr(encoding.utils, name) is getattr(legacy, name), name
        assert name in legacy.ALIASES["encoding.utils"], name
    for name in ("accuracy", "get_pixacc_miou"):
        assert getattr(encoding.utils.metrics, name) is getattr(legacy, name), name
        assert name not in encoding.utils.metrics.__all__  # by name only: the star list is PE's four helpers


# ------------------------------------------------------------------------------------------------ accuracy
def _topk_numpy(scores, target, k):
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return 100.0 * np.mean([t in row for t, row in zip(target, order)])


def test_accuracy_is_the_percentage_of_targets_among_the_k_best_scores():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(11, 6, generator=g, dtype=torch.float64)
    target = torch.randint(0, 6, (11,), generator=g)
    got = accuracy(scores, target, topk=(1, 2, 5, 6))
    assert isinstance(got, list) and len(got) == 4 and all(v.shape == (1,) for v in got)
    for k, value in zip((1, 2, 5, 6), got):
        assert value.item() == pytest.approx(_topk_numpy(scores.numpy(), target.numpy(), k), abs=1e-4)
    assert got[-1].item() == pytest.approx(100.0)  # every target is among all 6 classes
    assert accuracy(scores, target)[0].item() == pytest.approx(_topk_numpy(scores.numpy(), target.numpy(), 1),
                                                              abs=1e-4)


def test_accuracy_counts_each_sample_once():
    scores = torch.tensor([[0.9, 0.1, 0.0], [0.1, 0.8, 0.15], [0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    target = torch.tensor([0, 2, 1, 2])  # top-1 hits: sample 0; top-2 hits: samples 0, 1, 2; top-3: all
    top1, top2, top3 = accuracy(scores, target, topk=(1, 2, 3))
    assert [top1.item(), top2.item(), top3.item()] == pytest.approx([25.0, 75.0, 100.0])


# ----------------------------------------------------------------------------------------- get_pixacc_miou
def test_get_pixacc_miou_is_pe_formula_with_absent_classes_counting_zero():
    inter = np.array([3, 0, 5, 0])
    union = np.array([4, 2, 10, 0])  # class 3 absent everywhere: IoU 0 in PE's mean
    eps = np.spacing(1)
    with pytest.warns(FutureWarning, match="SegmentationMetric"):
        pix_acc, miou = get_pixacc_miou(17, 20, inter, union)
    assert pix_acc == pytest.approx(17 / (eps + 20), abs=0, rel=1e-15)
    assert miou == pytest.approx(np.mean(inter / (eps + union)), abs=0, rel=1e-15)
    assert miou == pytest.approx((0.75 + 0 + 0.5 + 0) / 4)
    assert isinstance(pix_acc, np.float64) and isinstance(miou, np.float64)


def test_get_pixacc_miou_takes_torch_dist_sum_tensors_and_matches_the_batch_helpers():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4, 5, 6, generator=g, dtype=torch.float64)
    target = torch.randint(-1, 4, (3, 5, 6), generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        correct, labeled = encoding.utils.batch_pix_accuracy(logits, target)
        inter, union = encoding.utils.batch_intersection_union(logits, target, 4)
        summed = torch_dist_sum(None, correct, labeled, inter, union)
        pix_acc, miou = get_pixacc_miou(*summed)
    pred, tgt = logits.argmax(1).numpy(), target.numpy()
    valid = tgt >= 0
    want_iou = [np.sum((pred == k) & (tgt == k)) / np.sum(valid & ((pred == k) | (tgt == k))) for k in range(4)]
    assert pix_acc == pytest.approx(np.sum((pred == tgt) & valid) / np.sum(valid), rel=1e-12)
    assert miou == pytest.approx(np.mean(want_iou), rel=1e-12)
    metric = encoding.utils.SegmentationMetric(4)  # PE's train_dist.py: get_all -> torch_dist_sum -> get_pixacc_miou
    metric.update(logits, target)
    got = [t.tolist() for t in metric.get_all()]
    assert got == [int(correct), int(labeled), np.asarray(inter).tolist(), np.asarray(union).tolist()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert get_pixacc_miou(*torch_dist_sum(None, *metric.get_all())) == (pix_acc, miou)


# -------------------------------------------------------------------------------------- get_selabel_vector
def test_get_selabel_vector_marks_the_classes_of_each_image():
    g = torch.Generator().manual_seed(2)
    target = torch.randint(0, 4, (3, 5, 5), generator=g)
    target[0, :2] = -1
    target[1, 3:] = 255  # outside [0, nclass): not a class (PE's histc range)
    target[2] = 1
    got = get_selabel_vector(target, 6)
    want = np.array([[float(np.isin(k, t)) for k in range(6)] for t in target.numpy()])
    assert got.dtype == torch.float32 and got.device.type == "cpu" and got.shape == (3, 6)
    assert np.array_equal(got.numpy(), want)
    assert got[2].tolist() == [0, 1, 0, 0, 0, 0]


def test_get_selabel_vector_is_the_se_loss_target():
    g = torch.Generator().manual_seed(3)
    out = torch.randn(2, 5, 4, 4, generator=g, dtype=torch.float64)
    se = torch.randn(2, 5, generator=g, dtype=torch.float64)
    target = torch.randint(-1, 3, (2, 4, 4), generator=g)
    with_se = encoding.nn.SegmentationLosses(se_loss=True, se_weight=1.0, nclass=5)(out, se, target)
    pixel = F.cross_entropy(out, target, ignore_index=-1)
    bce = F.binary_cross_entropy_with_logits(se, get_selabel_vector(target, 5).double())
    torch.testing.assert_close(with_se, pixel + bce, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------- MixUpWrapper
def test_mixup_wrapper_mixes_inputs_and_one_hot_targets_with_one_beta_draw():
    g = torch.Generator().manual_seed(4)
    batches = [(torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randint(0, 5, (4,), generator=g))
               for _ in range(2)]
    wrapper = MixUpWrapper(0.4, 5, batches, None)
    assert len(wrapper) == 2
    np.random.seed(7)
    torch.manual_seed(7)
    got = list(wrapper)
    np.random.seed(7)
    torch.manual_seed(7)
    for (data, target), (mixed, soft) in zip(batches, got):
        c = np.random.beta(0.4, 0.4)
        perm = torch.randperm(4).numpy()
        onehot = np.eye(5)[target.numpy()]
        np.testing.assert_allclose(mixed.numpy(), c * data.numpy() + (1 - c) * data.numpy()[perm], rtol=0,
                                   atol=1e-12)
        assert soft.dtype == torch.get_default_dtype() and soft.shape == (4, 5)
        np.testing.assert_allclose(soft.numpy(), c * onehot + (1 - c) * onehot[perm], rtol=0, atol=1e-6)
        np.testing.assert_allclose(soft.sum(1).numpy(), 1.0, atol=1e-6)
    assert [m.device.type for m, _ in MixUpWrapper(1.0, 5, batches, "cpu")] == ["cpu", "cpu"]
    with pytest.raises(ValueError, match="alpha"):
        MixUpWrapper(0.0, 5, batches, None)


# ---------------------------------------------------------------------------------------------- torch_dist_sum
def test_torch_dist_sum_without_a_process_group_returns_flat_copies():
    assert not torch.distributed.is_initialized()
    t = torch.tensor([[1.5, 2.5]], dtype=torch.float64)
    a, b, c = torch_dist_sum("cpu", t, 3, np.array([4, 5]))
    assert a.shape == (2,) and a.dtype == torch.float64 and a.tolist() == [1.5, 2.5]
    assert a.data_ptr() != t.data_ptr()
    a += 1
    assert t.tolist() == [[1.5, 2.5]]  # the input is untouched
    assert b.tolist() == [3] and b.dtype == torch.int64 and c.tolist() == [4, 5]


def _sum_worker(rank, world_size, port, out_dir):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from encoding.utils.dist import end_worker, init_distributed_mode

    assert init_distributed_mode(backend="gloo", timeout_s=60) is True
    try:
        sums = torch_dist_sum("cpu", torch.tensor([rank, 2.0 * rank], dtype=torch.float64), rank + 1,
                              np.array([10 * rank, 1]))
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump([s.tolist() for s in sums] + [[s.device.type for s in sums]], f)
    finally:
        torch.distributed.destroy_process_group()
    end_worker(0)


def test_torch_dist_sum_sums_over_two_gloo_processes(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_sum_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    for r in range(2):
        got = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert got == [[1.0, 2.0], [3], [10, 2], ["cpu", "cpu", "cpu"]]


# ------------------------------------------------------------------------------------------------- load_image
@pytest.fixture
def rgb_file(tmp_path):
    pixels = np.random.default_rng(5).integers(0, 256, size=(6, 10, 3), dtype=np.uint8)
    path = tmp_path / "photo.png"
    Image.fromarray(pixels).save(path)
    return path, pixels


def test_load_image_normalises_as_pe_default_transform(rgb_file):
    path, pixels = rgb_file
    got = load_image(str(path))
    want = (pixels.astype(np.float64) / 255.0 - MEAN) / STD
    assert got.shape == (3, 6, 10) and got.dtype == torch.float32  # no batch dimension, as PE's
    np.testing.assert_allclose(got.permute(1, 2, 0).double().numpy(), want, rtol=0, atol=1e-5)


def test_load_image_resizes_as_pe(rgb_file):
    path, pixels = rgb_file
    lanczos = Image.Resampling.LANCZOS
    assert load_image(path, size=5).shape == (3, 3, 5)  # width 5, height int(5 / 10 * 6)
    assert load_image(path, size=5, keep_asp=False).shape == (3, 5, 5)
    assert load_image(path, scale=2).shape == (3, 3, 5)
    small = np.asarray(Image.fromarray(pixels).resize((4, 2), lanczos), dtype=np.float64)
    np.testing.assert_allclose(load_image(path, size=4).permute(1, 2, 0).double().numpy(),
                               (small / 255.0 - MEAN) / STD, rtol=0, atol=1e-5)
    pil = load_image(path, transform=None)
    assert isinstance(pil, Image.Image) and np.array_equal(np.asarray(pil), pixels)
    doubled = load_image(path, transform=lambda im: 2 * np.asarray(im, dtype=np.float64))
    np.testing.assert_array_equal(doubled, 2.0 * pixels)


def test_load_image_errors_name_the_file(tmp_path):
    missing = tmp_path / "nowhere.jpg"
    with pytest.raises(DatasetError, match="nowhere.jpg"):
        load_image(missing)
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    with pytest.raises(Exception, match="garbage.png"):
        load_image(garbage)
    Image.new("RGB", (4, 2)).save(tmp_path / "tiny.png")
    with pytest.raises(ValueError, match="tiny.png"):
        load_image(tmp_path / "tiny.png", scale=10)


# -------------------------------------------------------------------------------------- LR_Scheduler defaults
def _optimizer():
    return torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)]},
                            {"params": [torch.zeros(1, requires_grad=True)]}], lr=1.0)


def test_lr_scheduler_step_mode_without_iters_per_epoch_follows_the_epoch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        sched = LR_Scheduler("step", 0.1, 30, lr_step=10, quiet=True)
        positional = LR_Scheduler("step", 0.1, 30, 0, 10, quiet=True)
    opt = _optimizer()
    for epoch in (0, 9, 10, 19, 20, 29):
        for i in (0, 3, 250):  # PE: the rate depends on the epoch alone
            lr = sched(opt, i, epoch, 0.0)
            want = 0.1 * 0.1 ** (epoch // 10)
            assert lr == pytest.approx(want, rel=1e-12)
            assert [g["lr"] for g in opt.param_groups] == pytest.approx([want, want], rel=1e-12)
            assert positional(_optimizer(), i, epoch, 0.0) == pytest.approx(want, rel=1e-12)


def test_lr_scheduler_without_iters_per_epoch_refuses_what_pe_could_not_compute():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for mode in ("poly", "cos"):
            with pytest.raises(ValueError, match="iters_per_epoch"):
                LR_Scheduler(mode, 0.1, 10)
        with pytest.raises(ValueError, match="optimizer"):
            LR_Scheduler("step", 0.1, 10, lr_step=2, optimizer=_optimizer())
        with pytest.raises(ValueError, match="lr_step"):
            LR_Scheduler("step", 0.1, 10)
        with pytest.warns(UserWarning, match="warmup_epochs=2 has no effect"):
            sched = LR_Scheduler("step", 0.1, 10, lr_step=3, warmup_epochs=2, quiet=True)
    assert sched(_optimizer(), 0, 0, 0.0) == pytest.approx(0.1)  # no warm-up: PE's 2 * 0 iterations
    assert sched(_optimizer(), 5, 4, 0.0) == pytest.approx(0.01)


def test_batch_pix_accuracy_refuses_out_of_range_targets_as_its_partner_does():
    """PE counted a target of 255 as a labeled, wrong pixel and -5 as unlabeled, while batch_intersection_union raised
    on both: the two denominators disagreed. Both raise now; -1 stays PE's unlabeled value."""
    logits = torch.tensor([[[[2.0, 0.0]], [[0.0, 2.0]]]])  # 1 x 2 x 1 x 2: labels 0, 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert encoding.utils.batch_pix_accuracy(logits, torch.tensor([[[0, -1]]])) == (1, 1)
        assert encoding.utils.batch_pix_accuracy(logits, torch.tensor([[[0, 0]]])) == (1, 2)
        for bad in (255, -5):
            for helper in (encoding.utils.batch_pix_accuracy,
                           lambda o, t: encoding.utils.batch_intersection_union(o, t, 2)):
                with pytest.raises(ValueError, match=rf"target values must lie in \[0, 2\) or equal "
                                                     rf"ignore_index=-1, got {bad}"):
                    helper(logits, torch.tensor([[[0, bad]]]))
