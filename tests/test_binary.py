"""Binary segmentation: the one-channel losses equal segmentation_models_pytorch's ``mode="binary"`` losses (float64,
<= 1e-10, values and gradients), are exact under DataParallelCriterion (3 CPU replicas, 3/2/2 split), and the
metric reports foreground IoU / Dice / precision / recall from thresholded sigmoid outputs."""
import math

import pytest
import segmentation_models_pytorch as smp
import torch
from conftest import TwoHeadNet, assert_replicated_step_is_exact, uneven_batch
from torch import nn

from encoding.nn.binary import BINARY_LOSSES, BinaryBCELoss, BinaryDiceLoss, BinaryFocalLoss
from encoding.utils.metrics import SegmentationMetric, binary_scores, to_labels

DEVICES = ["cpu"] * 3


def _logits_target(seed=0, ignore=True, batch=3, size=9):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(batch, 1, size, size, generator=g, dtype=torch.float64)).requires_grad_()
    target = torch.randint(0, 2, (batch, size, size), generator=g)
    if ignore:
        target[torch.rand(batch, size, size, generator=g) < 0.3] = -1
    return x, target


def _value_and_grad(loss_fn, x, target):
    loss = loss_fn(x, target)
    grad, = torch.autograd.grad(loss, x)
    return loss, grad


CASES = [
    (BinaryDiceLoss(), smp.losses.DiceLoss("binary", ignore_index=-1)),
    (BinaryDiceLoss(smooth=1.0), smp.losses.DiceLoss("binary", ignore_index=-1, smooth=1.0)),
    (BinaryDiceLoss(log_loss=True, eps=1e-5), smp.losses.DiceLoss("binary", ignore_index=-1, log_loss=True, eps=1e-5)),
    (BinaryFocalLoss(), smp.losses.FocalLoss("binary", ignore_index=-1)),
    (BinaryFocalLoss(gamma=0.5, alpha=0.25), smp.losses.FocalLoss("binary", ignore_index=-1, gamma=0.5, alpha=0.25)),
]


@pytest.mark.parametrize("ours, theirs", CASES, ids=lambda c: repr(c).split("(")[0])
def test_binary_losses_equal_smp_binary_mode(ours, theirs):
    x, target = _logits_target()
    mine, my_grad = _value_and_grad(ours, x, target)
    want, want_grad = _value_and_grad(lambda a, b: theirs(a, b.unsqueeze(1)), x, target)
    assert abs(mine.item() - want.item()) <= 1e-10
    assert (my_grad - want_grad).abs().max().item() <= 1e-10


def test_bce_equals_smp_without_ignore_and_torch_on_the_valid_pixels():
    x, target = _logits_target(ignore=False)
    mine, grad = _value_and_grad(BinaryBCELoss(), x, target)
    want, want_grad = _value_and_grad(lambda a, b: smp.losses.SoftBCEWithLogitsLoss()(a, b.unsqueeze(1).double()),
                                      x, target)
    assert abs(mine.item() - want.item()) <= 1e-10 and (grad - want_grad).abs().max().item() <= 1e-10
    x, target = _logits_target(seed=3)
    valid = target >= 0
    want = nn.functional.binary_cross_entropy_with_logits(x[:, 0][valid], target[valid].double())
    assert abs(BinaryBCELoss()(x, target).item() - want.item()) <= 1e-10


def test_dice_of_a_batch_without_foreground_is_zero_like_smp():
    x, _ = _logits_target()
    target = torch.zeros(3, 9, 9, dtype=torch.long)
    assert BinaryDiceLoss()(x, target).item() == 0.0
    assert smp.losses.DiceLoss("binary")(x, target.unsqueeze(1)).item() == 0.0


def test_bad_targets_and_options_are_refused():
    x, target = _logits_target()
    target[0, 0, 0] = 2
    with pytest.raises(ValueError, match=r"binary target values \[2\]"):
        BinaryBCELoss()(x, target)
    with pytest.raises(ValueError, match="channels but nclass=1"):
        BinaryDiceLoss()(torch.randn(2, 2, 4, 4), torch.zeros(2, 4, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="no se_loss"):
        BinaryFocalLoss(se_loss=True)


@pytest.mark.parametrize("name", ["bce", "dice", "focal"])
def test_binary_losses_are_exact_across_three_replicas(name):
    criterion = BINARY_LOSSES[name](aux=True, aux_weight=0.4)
    torch.manual_seed(0)
    net = TwoHeadNet(1, width=4).double()
    x, target = uneven_batch(2, seed=1)
    assert_replicated_step_is_exact(net, net, criterion, x, target, DEVICES, [3, 2, 2], atol=1e-10, rtol=0,
                                    grad_rtol=0, grad_atol=1e-10, naive_gap=1e-4)


def test_one_channel_logits_are_thresholded_and_foreground_scores_reported():
    logits = torch.tensor([[[[2.0, -1.0], [0.5, -3.0]]]])  # sigmoid: .88 .27 .62 .05
    target = torch.tensor([[[1, 1], [0, -1]]])
    labels, _ = to_labels(logits, target, 2)
    assert labels.tolist() == [[[1, 0], [1, 0]]]
    labels, _ = to_labels(logits, target, 2, threshold=0.7)
    assert labels.tolist() == [[[1, 0], [0, 0]]]
    metric = SegmentationMetric(2, threshold=0.5)
    metric.update(logits, target)
    scores = binary_scores(metric.confusion)
    tp, fp, fn = 1, 1, 1
    assert scores["fgIoU"] == pytest.approx(tp / (tp + fp + fn))
    assert scores["fgDice"] == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert scores["precision"] == pytest.approx(tp / (tp + fp)) and scores["recall"] == pytest.approx(tp / (tp + fn))
    assert math.isnan(binary_scores(torch.tensor([[4, 0], [0, 0]]))["precision"])
