"""Audit of ``encoding.parallel``: an input edited in place on repeated devices, the ``dim`` of ``ReplicaOutputs``
in ``gather`` and the criterion, and criteria returning a dict or tuple of scalar losses; each compared with the
plain module on the whole batch (float64, CPU replicas)."""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from encoding.parallel import DataParallelCriterion, DataParallelModel, gather
from encoding.parallel.criterion import InexactReductionWarning

TOL = dict(rtol=1e-10, atol=1e-10)


class InPlaceNorm(nn.Module):
    """Normalises its input in place, then convolves it (many "normalise inside the model" wrappers do)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.5, 0.4, 0.3], dtype=torch.float64).view(1, 3, 1, 1))
        self.conv = nn.Conv2d(3, 4, 3, padding=1).double()

    def forward(self, x):
        x.sub_(self.mean)
        return self.conv(x)


@pytest.mark.parametrize("devices, split", [(["cpu"] * 2, [3, 2]), (["cpu"] * 3, [2, 2, 1])])
def test_input_edited_in_place_on_repeated_devices(devices, split):
    """Before: every replica's slice was a view of the one input, sharing its autograd version counter, and the
    in-place ``sub_`` of one replica made the others' backward fail."""
    torch.manual_seed(0)
    net = InPlaceNorm()
    x = torch.rand(5, 3, 6, 6, dtype=torch.float64)
    y = torch.randint(0, 4, (5, 6, 6))
    ce = nn.CrossEntropyLoss()
    plain = ce(net(x.clone()), y)
    plain.backward()
    expected = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    outputs = DataParallelModel(net, devices)(x.clone())
    assert outputs.split_sizes == split
    loss = DataParallelCriterion(ce)(outputs, y)
    torch.testing.assert_close(loss, plain, **TOL)
    loss.backward()
    for p, g in zip(net.parameters(), expected):
        torch.testing.assert_close(p.grad, g, **TOL)


class ScaledInPlace(nn.Module):
    """Takes a 0-dim scale and edits it in place (a temperature clamped by the model, a counter advanced)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2).double()

    def forward(self, x, scale):
        scale.mul_(2)
        return self.lin(x) * scale


@pytest.mark.parametrize("devices", [["cpu"] * 2, ["cpu"] * 3])
def test_a_0_dim_input_edited_in_place_is_each_replicas_own(devices):
    """Before: every replica on a repeated device got the same 0-dim tensor object, so the model's ``mul_`` ran once
    per replica on it (the last replica saw 2**N, not 2) and the outputs differed from the plain module's."""
    torch.manual_seed(0)
    net, x = ScaledInPlace(), torch.randn(5, 3, dtype=torch.float64)
    plain = net(x, torch.tensor(1.5, dtype=torch.float64))
    outputs = DataParallelModel(net, devices)(x, torch.tensor(1.5, dtype=torch.float64))
    torch.testing.assert_close(gather(outputs), plain, **TOL)


class SequenceFirst(nn.Module):
    """``(T, N, F) -> (T, N, 2)``: the batch is dimension 1, as for ``nn.LSTM`` without ``batch_first``."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2).double()

    def forward(self, x):
        return self.lin(x)


def _sequence_first():
    torch.manual_seed(0)
    net = SequenceFirst()
    x, y = torch.randn(4, 5, 3, dtype=torch.float64), torch.randn(4, 5, 2, dtype=torch.float64)
    return net, x, y, DataParallelModel(net, ["cpu"] * 3, dim=1)(x)


def test_gather_defaults_to_the_dim_of_the_outputs():
    """Before: ``gather(outputs)`` concatenated along 0 a model's outputs split along ``dim=1``."""
    net, x, _, outputs = _sequence_first()
    assert outputs.dim == 1 and outputs.split_sizes == [2, 2, 1]
    torch.testing.assert_close(gather(outputs, "cpu"), net(x), **TOL)
    torch.testing.assert_close(gather(list(outputs), "cpu", 1), net(x), **TOL)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_criterion_splits_targets_along_the_dim_of_the_outputs(reduction):
    """Before: the targets were split along the criterion's ``dim`` (0), not along the model's (1): an error."""
    net, x, y, outputs = _sequence_first()
    mse = nn.MSELoss(reduction=reduction)
    plain = mse(net(x), y)
    plain.sum().backward()
    expected = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    loss = DataParallelCriterion(mse)(outputs, y)
    torch.testing.assert_close(loss, plain, **TOL)
    loss.sum().backward()
    for p, g in zip(net.parameters(), expected):
        torch.testing.assert_close(p.grad, g, **TOL)


def test_a_criterion_dim_given_splits_the_targets_along_it():
    """Targets whose batch dimension is not the outputs' (CTC's ``T x N x C`` outputs, ``N x ...`` targets): the
    criterion's own ``dim`` splits them, the model's split sizes kept."""
    net, x, _, outputs = _sequence_first()
    y = torch.randn(5, 2, dtype=torch.float64)  # one target per sequence: batch first

    class LastStep(nn.Module):
        reduction = "sum"  # a sum over the samples: exact across replicas

        def forward(self, output, target):
            return ((output[-1] - target) ** 2).sum()
    last_step = LastStep()
    plain = last_step(net(x), y)
    torch.testing.assert_close(DataParallelCriterion(last_step, dim=0)(outputs, y), plain, **TOL)


class TwoLosses(nn.Module):
    """A module of one's own without ``loss_terms`` returning several scalar losses (docs/parallel.md, case 6)."""

    def __init__(self, as_tuple=False):
        super().__init__()
        self.as_tuple = as_tuple

    def forward(self, out, target):
        ce, l2 = F.cross_entropy(out, target, ignore_index=-1), out.pow(2).mean()
        return (ce, 2, l2) if self.as_tuple else {"ce": ce, "l2": l2, "name": "two"}


@pytest.mark.parametrize("as_tuple", [False, True])
def test_container_of_scalar_losses_is_reduced_like_one_scalar(as_tuple):
    """Before: a dict / tuple of scalar losses came back as unweighted per-replica vectors, without the warning."""
    torch.manual_seed(0)
    net = nn.Linear(4, 3).double()
    x, y = torch.randn(7, 4, dtype=torch.float64), torch.randint(0, 3, (7,))
    criterion = DataParallelCriterion(TwoLosses(as_tuple))
    plain = TwoLosses(as_tuple)(net(x), y)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # warned once per wrapper
            outputs = DataParallelModel(net, ["cpu"] * 3)(x)
            assert outputs.split_sizes == [3, 2, 2]
            loss = criterion(outputs, y)
    assert [w.category for w in caught] == [InexactReductionWarning]
    assert type(loss) is type(plain)
    values = list(loss.values()) if isinstance(loss, dict) else list(loss)
    expected = list(plain.values()) if isinstance(plain, dict) else list(plain)
    for got, want in zip(values, expected):
        if isinstance(want, torch.Tensor):
            assert got.dim() == 0
            torch.testing.assert_close(got, want, **TOL)  # per-sample means: the share-weighted mean is exact
        else:
            assert got == want
    grads = {}
    for name, value in (("replicated", values), ("plain", expected)):
        net.zero_grad()
        sum(v for v in value if isinstance(v, torch.Tensor)).backward(retain_graph=True)
        grads[name] = [p.grad.clone() for p in net.parameters()]
    for a, b in zip(grads["replicated"], grads["plain"]):
        torch.testing.assert_close(a, b, **TOL)


def test_container_of_scalar_losses_falls_back_to_the_whole_batch_where_undefined():
    """A replica whose targets are all ignored makes its cross-entropy 0/0: the whole batch defines the loss."""
    torch.manual_seed(0)
    net = nn.Linear(4, 3).double()
    x, y = torch.randn(4, 4, dtype=torch.float64), torch.tensor([0, 2, -1, -1])
    plain = TwoLosses()(net(x), y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InexactReductionWarning)
        loss = DataParallelCriterion(TwoLosses())(DataParallelModel(net, ["cpu"] * 2)(x), y)
    assert set(loss) == {"ce", "l2", "name"} and loss["name"] == "two"
    torch.testing.assert_close(loss["ce"], plain["ce"], **TOL)
    torch.testing.assert_close(loss["l2"], plain["l2"], **TOL)
