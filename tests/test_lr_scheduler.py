"""LR_Scheduler: exact values, head multiplier, PE-style and torch-style driving, resume."""
import io
import logging
import math

import pytest
import torch

from encoding.utils import LR_Scheduler, LR_Scheduler_Head
from encoding.utils.lr_scheduler import IterationLR


def two_group_optimizer(lr=0.1):
    backbone, head = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    return torch.optim.SGD([{"params": backbone.parameters()}, {"params": head.parameters()}], lr=lr, momentum=0.9)


def test_poly_values():
    sched = LR_Scheduler("poly", 0.01, num_epochs=10, iters_per_epoch=100)
    N = 1000
    for T in (0, 1, 250, 999, 1000):
        assert sched.lr_at(T) == pytest.approx(0.01 * (1 - T / N) ** 0.9, rel=1e-15, abs=0)
    assert sched.lr_at(500) == pytest.approx(0.01 * 0.5 ** 0.9, rel=1e-15)
    assert sched.lr_at(5000) == 0.0  # clamped past the end (no complex powers)


def test_cos_values():
    sched = LR_Scheduler("cos", 0.004, num_epochs=4, iters_per_epoch=25)
    assert sched.lr_at(0) == 0.004
    assert sched.lr_at(50) == pytest.approx(0.002, rel=1e-15)
    assert sched.lr_at(25) == pytest.approx(0.002 * (1 + math.cos(math.pi / 4)), rel=1e-15)
    assert sched.lr_at(100) == pytest.approx(0.0, abs=1e-18)
    assert sched.lr_at(150) == sched.lr_at(100)


def test_step_values():
    sched = LR_Scheduler("step", 0.1, num_epochs=30, iters_per_epoch=7, lr_step=10)
    assert sched.lr_at(0) == 0.1
    assert sched.lr_at(10 * 7 - 1) == 0.1                 # last iteration of epoch 9
    assert sched.lr_at(10 * 7) == pytest.approx(0.01)     # epoch 10
    assert sched.lr_at(25 * 7 + 3) == pytest.approx(0.001)


def test_warmup_then_poly_over_the_remaining_iterations():
    sched = LR_Scheduler("poly", 0.02, num_epochs=5, iters_per_epoch=10, warmup_epochs=1)
    assert sched.lr_at(0) == 0.0
    assert sched.lr_at(3) == pytest.approx(0.02 * 3 / 10, rel=1e-15)
    assert sched.lr_at(10) == 0.02                         # warm-up done: poly starts at base_lr
    assert sched.lr_at(30) == pytest.approx(0.02 * (1 - 20 / 40) ** 0.9, rel=1e-15)
    step = LR_Scheduler("step", 0.1, num_epochs=5, iters_per_epoch=10, lr_step=2, warmup_epochs=1)
    assert step.lr_at(5) == pytest.approx(0.05) and step.lr_at(25) == pytest.approx(0.01)


def test_head_multiplier_and_pe_call(caplog):
    """PyTorch-Encoding's LR_Scheduler_Head runs the groups after the first at 10x; its LR_Scheduler gives every
    group one rate (its recognition scripts' two groups, --no-bn-wd); ``quiet=`` announces nothing."""
    opt = two_group_optimizer()
    sched = LR_Scheduler_Head("poly", 0.01, num_epochs=2, iters_per_epoch=5)
    with caplog.at_level(logging.INFO, logger="encoding.utils.lr_scheduler"):
        sched(opt, 3, 1, best_pred=0.5)
        lr = sched(opt, 4, 1, best_pred=0.5)
        expected = 0.01 * (1 - 9 / 10) ** 0.9
        assert lr == pytest.approx(expected, rel=1e-15)
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([expected, 10 * expected], rel=1e-15)
        assert len([r for r in caplog.records if "Epoch 1" in r.getMessage()]) == 1  # announced once per epoch
        assert sched.last_epoch == 9 and isinstance(sched, LR_Scheduler)
        one_rate = LR_Scheduler("poly", 0.01, num_epochs=2, iters_per_epoch=5, quiet=True)
        assert one_rate(opt, 4, 1, best_pred=0.5) == pytest.approx(expected, rel=1e-15)
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([expected, expected], rel=1e-15)
        assert len([r for r in caplog.records if "Epoch 1" in r.getMessage()]) == 1  # quiet: nothing more
    opt.param_groups[1]["lr_mult"] = 3.0
    sched(opt, 0, 0)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.01, 0.03])
    with pytest.warns(FutureWarning, match="head_multiplier= is now head_lr_mult="):  # the old name still works
        single = LR_Scheduler_Head("poly", 0.01, 2, 5, head_multiplier=1.0)
    opt2 = two_group_optimizer()
    single(opt2, 0, 0)
    assert [g["lr"] for g in opt2.param_groups] == [0.01, 0.01]


def test_torch_style_matches_pe_style():
    opt_a, opt_b = two_group_optimizer(), two_group_optimizer()
    torch_style = LR_Scheduler("poly", 0.1, 3, 4, warmup_epochs=1, optimizer=opt_a)
    pe_style = LR_Scheduler("poly", 0.1, 3, 4, warmup_epochs=1)
    assert isinstance(torch_style, torch.optim.lr_scheduler.LRScheduler)
    for epoch in range(3):
        for i in range(4):
            pe_style(opt_b, i, epoch)
            assert torch_style.get_last_lr() == [g["lr"] for g in opt_b.param_groups]
            assert torch_style.get_lr() == torch_style.get_last_lr()
            opt_a.step()
            torch_style.step()
    assert torch_style.last_epoch == 12 and torch_style.get_last_lr() == [0.0, 0.0]


def test_state_dict_resume_continues_the_schedule():
    opt = two_group_optimizer()
    sched = LR_Scheduler("cos", 0.05, 4, 6, optimizer=opt)
    for _ in range(9):
        opt.step()
        sched.step()
    buffer = io.BytesIO()
    torch.save({"scheduler": sched.state_dict(), "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    expected = []
    for _ in range(5):
        opt.step()
        sched.step()
        expected.append(sched.get_last_lr())
    opt2 = two_group_optimizer()
    resumed = LR_Scheduler("poly", 1.0, 2, 1, optimizer=opt2)  # different settings: the state dict restores them
    opt2.load_state_dict(saved["optimizer"])
    resumed.load_state_dict(saved["scheduler"])
    got = []
    for _ in range(5):
        opt2.step()
        resumed.step()
        got.append(resumed.get_last_lr())
    assert got == expected
    with pytest.raises(KeyError, match="unexpected keys"):
        resumed.load_state_dict({"bogus": 1})


def test_validation_errors():
    with pytest.raises(ValueError, match="mode"):
        LR_Scheduler("linear", 0.1, 10, 5)
    with pytest.raises(ValueError, match="lr_step"):
        LR_Scheduler("step", 0.1, 10, 5)
    with pytest.raises(ValueError, match="warmup_epochs"):
        LR_Scheduler("poly", 0.1, 10, 5, warmup_epochs=11)
    with pytest.raises(ValueError, match="iters_per_epoch"):
        LR_Scheduler("poly", 0.1, 10, 0)
    with pytest.raises(RuntimeError, match="no optimizer"):
        LR_Scheduler("poly", 0.1, 10, 5).step()
    with pytest.raises(ValueError, match="takes no epoch"):
        LR_Scheduler("poly", 0.1, 10, 5, optimizer=two_group_optimizer()).step(3)


def test_a_fractional_warmup_and_one_that_takes_the_whole_run():
    """Half an epoch of 10 iterations warms up for 5; a warm-up as long as the run rises to the base rate and
    stays there (no decay follows), also past the end."""
    half = IterationLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), "poly", 0.1, 2, 10,
                       warmup_epochs=0.5)
    assert half.warmup_iters == 5 and half.total_iters == 15
    assert [round(half.lr_at(t), 6) for t in (0, 1, 4, 5)] == [0.0, 0.02, 0.08, 0.1]
    assert half.lr_at(20) == 0.0
    whole = IterationLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), "poly", 0.1, 1, 10,
                        warmup_epochs=1)
    assert [round(whole.lr_at(t), 6) for t in (0, 5, 9)] == [0.0, 0.05, 0.09]
    assert whole.lr_at(10) == whole.lr_at(50) == 0.1
