"""encoding.compat: PyTorch-Encoding conventions implemented once, re-exported where PE users import them."""
import importlib

import pytest
import torch

import encoding
from encoding import compat
from encoding.nn import SegmentationLosses
from encoding.utils.lr_scheduler import IterationLR
from encoding.utils.metrics import SegmentationMetric


def test_every_pe_name_resolves_to_the_compat_object():
    for module_name, names in compat.EXPORTS.items():
        module = importlib.import_module(module_name)
        for name in names:
            assert getattr(module, name) is getattr(compat, name), (module_name, name)
            assert name in module.__all__, (module_name, name)
    assert encoding.nn.DistSyncBatchNorm is compat.DistSyncBatchNorm is encoding.nn.SyncBatchNorm
    assert encoding.utils.mkdir is compat.mkdir and encoding.utils.check_sha1 is compat.check_sha1
    with pytest.raises(AttributeError, match="no attribute 'bogus'"):
        encoding.utils.bogus  # noqa: B018


def test_core_scheduler_is_torch_style_only():
    opt = torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)]},
                           {"params": [torch.zeros(1, requires_grad=True)]}], lr=1.0)
    core = IterationLR(opt, "poly", 0.1, num_epochs=2, iters_per_epoch=3)
    assert not callable(core)  # one driving style: step()
    assert core.get_last_lr() == [0.1, pytest.approx(1.0)] and core.last_epoch == 0
    for _ in range(6):
        opt.step()
        core.step()
    assert core.last_epoch == 6 and core.get_last_lr() == [0.0, 0.0]
    with pytest.raises(TypeError, match="Optimizer"):
        IterationLR(None, "poly", 0.1, 2, 3)
    assert issubclass(compat.LR_Scheduler, IterationLR)


def test_pe_loss_layouts_are_adapted_to_the_core_call():
    g = torch.Generator().manual_seed(0)
    out, aux, se = torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3)
    target = torch.randint(-1, 3, (2, 4, 4), generator=g)
    named, tgt = compat.loss_inputs((out, se, aux, target), se_loss=True, aux=True)
    assert tgt is target and named["out"] is out and named["se"] is se and named["aux"] is aux
    criterion = SegmentationLosses(se_loss=True, aux=True)
    core = criterion({"out": out, "aux": aux, "se": se}, target)
    for call in ((out, se, aux, target), ((out, se, aux), target), ([out, se, aux], target)):
        torch.testing.assert_close(criterion(*call), core, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\(out, aux\)"):
        compat.loss_inputs((out, target), se_loss=False, aux=True)


def test_metric_targets_are_scattered_like_the_outputs(monkeypatch):
    from encoding.utils import metrics

    calls = []
    real = metrics.scatter
    monkeypatch.setattr(metrics, "scatter", lambda *a, **k: calls.append(k) or real(*a, **k))
    logits, target = torch.randn(5, 3, 2, 2), torch.randint(0, 3, (5, 2, 2))
    metric = SegmentationMetric(3)
    metric.update([logits[:2], logits[2:]], target)
    assert calls == [{"split_sizes": [2, 3]}]
    whole = SegmentationMetric(3)
    whole.update(logits, target)
    assert torch.equal(metric.confusion, whole.confusion)
