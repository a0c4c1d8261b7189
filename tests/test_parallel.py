"""encoding.parallel: exactness against the plain single-device computation (float64) and the wrapper contract."""
import collections
import copy
import dataclasses
import gc
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from encoding.nn import SyncBatchNorm
from encoding.parallel import (CallbackContext, DataParallelCriterion, DataParallelModel, DataParallelWithCallback,
                               LossTerm, PerSample, ReplicaAbortedError, allreduce, broadcast, data_parallel, gather,
                               get_replica_context, parallel_apply, patch_replication_callback,
                               reduce_loss_terms, replicate, scatter)
from encoding.parallel.criterion import InexactReductionWarning
from encoding.parallel.devices import resolve_device
from encoding.parallel.scatter_gather import get_split_sizes

CPU3 = ["cpu"] * 3
TOL = dict(rtol=0, atol=1e-6)


class SmallNet(nn.Module):
    """A tiny conv net with a main and an optional auxiliary output."""

    def __init__(self, nclass: int = 5, dict_output: bool = False):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(8, nclass, 1)
        self.aux = nn.Conv2d(8, nclass, 1) if dict_output else None
        self.dict_output = dict_output

    def forward(self, x):
        feat = self.body(x)
        if self.dict_output:
            return {"out": self.head(feat), "aux": self.aux(feat)}
        return self.head(feat)


class MainAuxLoss(nn.Module):
    """A user criterion implementing the exact-reduction protocol for a dict output with an aux head."""

    def __init__(self, aux_weight: float = 0.4, ignore_index: int = -1):
        super().__init__()
        self.aux_weight = aux_weight
        self.ignore_index = ignore_index

    def loss_terms(self, output, target):
        valid = (target != self.ignore_index).sum()
        main = F.cross_entropy(output["out"], target, ignore_index=self.ignore_index, reduction="sum")
        aux = F.cross_entropy(output["aux"], target, ignore_index=self.ignore_index, reduction="sum")
        return [LossTerm(main, valid), LossTerm(aux, valid, self.aux_weight)]

    def forward(self, output, target):
        return reduce_loss_terms([self.loss_terms(output, target)])


def make_batch(n=7, nclass=5, size=8, seed=0):
    """A float64 batch whose ignore pixels (~30%) are placed unevenly: sample 0 is almost all ignored."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g, dtype=torch.float64)
    y = torch.randint(0, nclass, (n, size, size), generator=g)
    p = torch.linspace(0.05, 0.5, n).view(n, 1, 1)
    y[torch.rand(n, size, size, generator=g) < p] = -1
    y[0, :, 1:] = -1
    return x, y


def grads(loss, module):
    return torch.autograd.grad(loss, list(module.parameters()))


def assert_all_close(a, b):
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, **TOL)


# --------------------------------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("criterion", [
    nn.CrossEntropyLoss(ignore_index=-1),
    nn.CrossEntropyLoss(ignore_index=-1, weight=torch.tensor([0.5, 1.0, 2.0, 1.5, 0.25], dtype=torch.float64)),
    nn.CrossEntropyLoss(ignore_index=-1, label_smoothing=0.1,
                        weight=torch.tensor([0.5, 1.0, 2.0, 1.5, 0.25], dtype=torch.float64)),
    nn.CrossEntropyLoss(ignore_index=-1, reduction="sum"),
], ids=["ce", "ce-weight", "ce-weight-smoothing", "ce-sum"])
def test_loss_and_grads_equal_whole_batch(criterion):
    torch.manual_seed(0)
    net = SmallNet().double()
    x, y = make_batch()
    ref = criterion(net(x), y)
    ref_grads = grads(ref, net)
    outputs = DataParallelModel(net, CPU3)(x)
    assert outputs.split_sizes == [3, 2, 2]
    loss = DataParallelCriterion(criterion, CPU3)(outputs, y)
    torch.testing.assert_close(loss, ref, **TOL)
    assert_all_close(grads(loss, net), ref_grads)


@pytest.mark.parametrize("call", ["positional", "target"])
def test_a_torch_loss_called_with_torchs_argument_names_is_reduced_exactly(call):
    """``criterion(outputs, target=y)`` is the same call as ``criterion(outputs, y)``: exact, no warning."""
    torch.manual_seed(0)
    net = SmallNet().double()
    x, y = make_batch()
    criterion = nn.CrossEntropyLoss(ignore_index=-1)
    ref = criterion(net(x), y)
    ref_grads = grads(ref, net)
    outputs = DataParallelModel(net, CPU3)(x)
    parallel = DataParallelCriterion(criterion, CPU3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactReductionWarning)
        loss = parallel(outputs, y) if call == "positional" else parallel(outputs, target=y)
    torch.testing.assert_close(loss, ref, **TOL)
    assert_all_close(grads(loss, net), ref_grads)


def test_unweighted_mean_would_be_biased():
    """Guard the test data: PyTorch-Encoding's unweighted mean differs clearly from the true loss here."""
    net = SmallNet().double()
    x, y = make_batch()
    criterion = nn.CrossEntropyLoss(ignore_index=-1)
    parts = [criterion(net(xi), yi) for xi, yi in zip(x.split([3, 2, 2]), y.split([3, 2, 2]))]
    assert abs(sum(parts) / 3 - criterion(net(x), y)) > 1e-3


def test_nll_and_generic_fallbacks_are_exact():
    net = nn.Sequential(nn.Linear(4, 3), nn.LogSoftmax(dim=1)).double()
    x = torch.randn(7, 4, dtype=torch.float64)
    y = torch.tensor([0, -1, 2, 1, -1, -1, 2])
    for criterion, target in ((nn.NLLLoss(ignore_index=-1), y),
                              (nn.MSELoss(), torch.randn(7, 3, dtype=torch.float64)),
                              (nn.L1Loss(reduction="sum"), torch.randn(7, 3, dtype=torch.float64))):
        ref = criterion(net(x), target)
        loss = DataParallelCriterion(criterion, CPU3)(DataParallelModel(net, CPU3)(x), target)
        torch.testing.assert_close(loss, ref, **TOL)
        assert_all_close(grads(loss, net), grads(ref, net))


def test_reduction_none_is_gathered():
    net = nn.Linear(4, 3).double()
    x, y = torch.randn(7, 4, dtype=torch.float64), torch.randint(0, 3, (7,))
    criterion = nn.CrossEntropyLoss(reduction="none")
    loss = DataParallelCriterion(criterion, CPU3)(DataParallelModel(net, CPU3)(x), y)
    torch.testing.assert_close(loss, criterion(net(x), y), **TOL)


def test_three_sgd_steps_match_plain_training():
    torch.manual_seed(1)
    plain = SmallNet().double()
    parallel = SmallNet().double()
    parallel.load_state_dict(plain.state_dict())
    criterion = nn.CrossEntropyLoss(ignore_index=-1)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.5, momentum=0.9)
    opt_parallel = torch.optim.SGD(parallel.parameters(), lr=0.5, momentum=0.9)
    model, dp_criterion = DataParallelModel(parallel, CPU3), DataParallelCriterion(criterion, CPU3)
    for step in range(3):
        x, y = make_batch(seed=step)
        for opt, loss_fn in ((opt_plain, lambda: criterion(plain(x), y)),
                             (opt_parallel, lambda: dp_criterion(model(x), y))):
            opt.zero_grad()
            loss_fn().backward()
            opt.step()
    for a, b in zip(plain.parameters(), parallel.parameters()):
        torch.testing.assert_close(a, b, **TOL)


def test_dict_output_with_aux_head_and_protocol_criterion():
    torch.manual_seed(2)
    net = SmallNet(dict_output=True).double()
    x, y = make_batch()
    criterion = MainAuxLoss()
    ref = criterion(net(x), y)
    outputs = DataParallelModel(net, CPU3)(x)
    assert set(outputs[0]) == {"out", "aux"}
    loss = DataParallelCriterion(criterion, CPU3)(outputs, y)
    torch.testing.assert_close(loss, ref, **TOL)
    assert_all_close(grads(loss, net), grads(ref, net))


# ------------------------------------------------- torch's losses, dict outputs, plain functions (issues 23, 24)

WEIGHT = torch.tensor([0.5, 1.0, 2.0, 1.5, 0.25], dtype=torch.float64)


def _class_target(n, y):
    return y


def _probability_target(n, y):
    return torch.rand(n, 5, 8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def _regression_target(n, y):
    return torch.randn(n, 5, 8, 8, generator=torch.Generator().manual_seed(4), dtype=torch.float64)


TORCH_LOSSES = {  # id: (criterion, activation on the logits, target maker)
    "ce": (nn.CrossEntropyLoss(), None, lambda n, y: y.clamp(min=0)),
    "ce-ignore": (nn.CrossEntropyLoss(ignore_index=-1), None, _class_target),
    "ce-weight": (nn.CrossEntropyLoss(weight=WEIGHT), None, lambda n, y: y.clamp(min=0)),
    "ce-weight-ignore": (nn.CrossEntropyLoss(weight=WEIGHT, ignore_index=-1), None, _class_target),
    "ce-weight-ignore-smoothing": (nn.CrossEntropyLoss(weight=WEIGHT, ignore_index=-1, label_smoothing=0.2), None,
                                   _class_target),
    "ce-probabilities": (nn.CrossEntropyLoss(), None, lambda n, y: _probability_target(n, y).softmax(1)),
    "ce-sum": (nn.CrossEntropyLoss(weight=WEIGHT, ignore_index=-1, reduction="sum"), None, _class_target),
    "nll-weight-ignore": (nn.NLLLoss(weight=WEIGHT, ignore_index=-1), nn.LogSoftmax(1), _class_target),
    "nll-sum": (nn.NLLLoss(ignore_index=-1, reduction="sum"), nn.LogSoftmax(1), _class_target),
    "bce-logits": (nn.BCEWithLogitsLoss(), None, _probability_target),
    "bce-logits-weight": (nn.BCEWithLogitsLoss(weight=WEIGHT.view(5, 1, 1), pos_weight=WEIGHT.view(5, 1, 1) * 2),
                          None, _probability_target),
    "bce-logits-sum": (nn.BCEWithLogitsLoss(reduction="sum"), None, _probability_target),
    "bce": (nn.BCELoss(), nn.Sigmoid(), _probability_target),
    "mse": (nn.MSELoss(), None, _regression_target),
    "mse-sum": (nn.MSELoss(reduction="sum"), None, _regression_target),
    "l1": (nn.L1Loss(), None, _regression_target),
    "l1-sum": (nn.L1Loss(reduction="sum"), None, _regression_target),
    "smooth-l1": (nn.SmoothL1Loss(beta=0.5), None, _regression_target),
    "huber": (nn.HuberLoss(delta=0.5), None, _regression_target),
    "kl-div": (nn.KLDivLoss(reduction="batchmean"), nn.LogSoftmax(1),
               lambda n, y: _probability_target(n, y).softmax(1)),
}


@pytest.mark.parametrize("name", list(TORCH_LOSSES))
def test_torch_losses_reduce_exactly_and_silently(name):
    """torch's own loss modules, with their reduction, ignore_index and weights, give the whole-batch loss and
    gradients on 3 replicas splitting 7 samples 3/2/2 (replica 0 holds an almost fully ignored image)."""
    criterion, activation, make_target = TORCH_LOSSES[name]
    torch.manual_seed(0)
    net = SmallNet().double()
    net = nn.Sequential(net, activation) if activation is not None else net
    x, y = make_batch()
    target = make_target(7, y)
    ref = criterion(net(x), target)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactReductionWarning)
        outputs = DataParallelModel(net, CPU3)(x)
        assert outputs.split_sizes == [3, 2, 2]
        loss = DataParallelCriterion(criterion, CPU3)(outputs, target)
    torch.testing.assert_close(loss, ref, **TOL)
    assert_all_close(grads(loss, net), grads(ref, net))


@pytest.mark.parametrize("criterion", [nn.CrossEntropyLoss(ignore_index=-1),
                                       nn.CrossEntropyLoss(weight=WEIGHT, ignore_index=-1, label_smoothing=0.1)],
                         ids=["ce-ignore", "ce-weight-ignore-smoothing"])
@pytest.mark.parametrize("aux_weight", [None, 0.5])
@pytest.mark.parametrize("devices", [CPU3, ["cpu"]], ids=["3-replicas", "1-device"])
def test_dict_outputs_with_output_key_and_aux_weight_are_exact(criterion, aux_weight, devices):
    """A model returning {"out", "aux"} (torchvision's layout) with a plain torch loss: output_key picks the main
    output, aux_weight adds the aux loss as torchvision's reference training does; whole-batch value and grads."""
    torch.manual_seed(2)
    net = SmallNet(dict_output=True).double()
    x, y = make_batch()
    out = net(x)
    ref = criterion(out["out"], y) + (aux_weight * criterion(out["aux"], y) if aux_weight else 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", InexactReductionWarning)
        wrapped = DataParallelCriterion(criterion, devices, output_key="out", aux_weight=aux_weight)
        loss = wrapped(DataParallelModel(net, devices)(x), y)
    torch.testing.assert_close(loss, ref, **TOL)
    used = [net.body, net.head] + ([net.aux] if aux_weight else [])
    params = [p for module in used for p in module.parameters()]
    assert_all_close(torch.autograd.grad(loss, params), torch.autograd.grad(ref, params))


def test_tuple_outputs_take_an_index_as_output_key():
    net = nn.Sequential(nn.Linear(4, 3), nn.Tanh()).double()
    model = DataParallelModel(_Pair(net), CPU3)
    x, y = torch.randn(7, 4, dtype=torch.float64), torch.tensor([0, -1, 2, 1, -1, -1, 2])
    criterion = nn.CrossEntropyLoss(ignore_index=-1)
    loss = DataParallelCriterion(criterion, CPU3, output_key=0, aux_key=1, aux_weight=0.25)(model(x), y)
    ref = criterion(net(x), y) + 0.25 * criterion(2 * net(x), y)
    torch.testing.assert_close(loss, ref, **TOL)


class _Pair(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        out = self.net(x)
        return out, 2 * out


def test_dict_output_without_output_key_says_what_to_pass():
    """Was a deep TypeError from a replica thread."""
    net = SmallNet(dict_output=True).double()
    x, y = make_batch()
    for devices in (CPU3, ["cpu"]):
        outputs = DataParallelModel(net, devices)(x)
        with pytest.raises(ValueError, match=r"CrossEntropyLoss takes one tensor but the model returns a dict with "
                                             r"keys \['out', 'aux'\]: pass output_key='out' \(and aux_weight=0.5"):
            DataParallelCriterion(nn.CrossEntropyLoss(ignore_index=-1), devices)(outputs, y)
    with pytest.raises(ValueError, match=r"output_key='main' is not in the model's output, which is a dict with "
                                         r"keys \['out', 'aux'\]"):
        DataParallelCriterion(nn.CrossEntropyLoss(), CPU3, output_key="main")(DataParallelModel(net, CPU3)(x), y)
    with pytest.raises(ValueError, match=r"output_key=0 needs a dict or tuple output, the model returns a tensor"):
        DataParallelCriterion(nn.CrossEntropyLoss(), CPU3, output_key=0)(
            DataParallelModel(SmallNet().double(), CPU3)(x), y)
    with pytest.raises(ValueError, match=r"aux_key='aux2' is not in the model's output"):
        DataParallelCriterion(nn.CrossEntropyLoss(), CPU3, output_key="out", aux_key="aux2",
                              aux_weight=0.1)(DataParallelModel(net, CPU3)(x), y)


def test_plain_function_warns_once_per_wrapper_and_says_what_to_do():
    """A lambda over the dict output ran silently inexact (per-replica means weighted by batch share)."""
    net = SmallNet(dict_output=True).double()
    x, y = make_batch()
    model = DataParallelModel(net, CPU3)
    function = lambda out, t: F.cross_entropy(out["out"], t, ignore_index=-1)  # noqa: E731
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapper = DataParallelCriterion(function, CPU3)
            first = wrapper(model(x), y)
            wrapper(model(x), y)
        messages = [str(w.message) for w in caught if issubclass(w.category, InexactReductionWarning)]
        assert len(messages) == 1 and caught[0].filename == __file__, [(w.filename, w.message) for w in caught]
        assert "cannot reduce <lambda> exactly" in messages[0]
        assert "nn.CrossEntropyLoss(ignore_index=255), output_key='out', aux_weight=0.5" in messages[0]
        assert "loss_terms" in messages[0]
    # the value it warns about: the batch-share weighting of per-replica means, not the whole batch's loss
    assert abs(first - function(net(x), y)) > 1e-4
    with pytest.warns(InexactReductionWarning, match="cannot reduce Unknown exactly"):
        DataParallelCriterion(Unknown(), CPU3)(DataParallelModel(SmallNet().double(), CPU3)(x), y)
    with warnings.catch_warnings():  # one device: the criterion is called on the whole batch, nothing to warn about
        warnings.simplefilter("error", InexactReductionWarning)
        DataParallelCriterion(function, ["cpu"])(DataParallelModel(net, ["cpu"])(x), y)


class Unknown(nn.Module):
    def forward(self, out, target):
        return F.cross_entropy(out, target, ignore_index=-1)


@pytest.mark.parametrize("criterion", [lambda out, t: F.cross_entropy(out, t, ignore_index=-1), Unknown(),
                                       nn.CrossEntropyLoss(ignore_index=-1)], ids=["lambda", "module", "torch"])
def test_a_replica_whose_targets_are_all_ignored_gives_the_whole_batch_loss_not_nan(criterion):
    """Issue 24 item 11: the last replica's targets are all ignored; the whole batch's loss is defined, so the
    parallel loss is that value (and its gradients), never NaN."""
    torch.manual_seed(3)
    net = SmallNet().double()
    x, y = make_batch()
    y[5:] = -1
    ref = criterion(net(x), y)
    assert torch.isfinite(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InexactReductionWarning)
        loss = DataParallelCriterion(criterion, CPU3)(DataParallelModel(net, CPU3)(x), y)
    torch.testing.assert_close(loss, ref, **TOL)
    assert_all_close(grads(loss, net), grads(ref, net))
    y[:] = -1  # no valid target anywhere: undefined on the whole batch too, as torch says
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InexactReductionWarning)
        assert torch.isnan(DataParallelCriterion(criterion, CPU3)(DataParallelModel(net, CPU3)(x), y))


def test_wrappers_validate_their_arguments():
    with pytest.raises(TypeError, match="DataParallelCriterion: criterion must be a module or a callable, got str"):
        DataParallelCriterion("cross_entropy")
    for bad in (-0.5, float("nan"), float("inf"), "0.5", True):
        with pytest.raises(ValueError, match=r"DataParallelCriterion: aux_weight must be a finite number >= 0"):
            DataParallelCriterion(nn.CrossEntropyLoss(), output_key="out", aux_weight=bad)
    with pytest.raises(ValueError, match="DataParallelCriterion: aux_weight needs output_key"):
        DataParallelCriterion(nn.CrossEntropyLoss(), aux_weight=0.5)
    with pytest.raises(ValueError, match="aux_weight needs a scalar loss"):
        DataParallelCriterion(nn.CrossEntropyLoss(reduction="none"), output_key="out", aux_weight=0.5)
    with pytest.raises(TypeError, match="DataParallelCriterion: dim must be an int"):
        DataParallelCriterion(nn.CrossEntropyLoss(), dim="0")
    with pytest.raises(TypeError, match="DataParallelModel: module must be an nn.Module, got function"):
        DataParallelModel(lambda x: x, CPU3)
    with pytest.raises(TypeError, match="DataParallelModel: dim must be an int"):
        DataParallelModel(nn.Identity(), CPU3, dim=0.0)
    assert "output_key='out', aux_key='aux', aux_weight=0.5" in repr(
        DataParallelCriterion(nn.CrossEntropyLoss(), output_key="out", aux_weight=0.5))


def test_data_parallel_functional_gathers():
    net = SmallNet().double()
    x, _ = make_batch()
    torch.testing.assert_close(data_parallel(net, x, CPU3), net(x), **TOL)
    torch.testing.assert_close(data_parallel(net, (x,), []), net(x), **TOL)


# --------------------------------------------------------------------------------------------------- contract


@pytest.mark.parametrize("device_ids", [[], ["cpu"], CPU3, [torch.device("cpu")] * 2], ids=["none", "one", "three",
                                                                                            "torch-devices"])
def test_one_return_contract(device_ids):
    net = nn.Linear(4, 2).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    outputs = DataParallelModel(net, device_ids)(x)
    assert isinstance(outputs, list)
    assert len(outputs) == max(1, len(device_ids))
    torch.testing.assert_close(torch.cat(list(outputs)), net(x), **TOL)
    y = torch.randn(5, 2, dtype=torch.float64)
    loss = DataParallelCriterion(nn.MSELoss(), device_ids)(outputs, y)
    torch.testing.assert_close(loss, F.mse_loss(net(x), y), **TOL)


def test_default_device_ids_on_cpu_only_machine():
    if torch.cuda.is_available():
        assert DataParallelModel(nn.Linear(1, 1)).device_ids == [torch.device("cuda", i)
                                                                 for i in range(torch.cuda.device_count())]
    else:
        assert DataParallelModel(nn.Linear(1, 1)).device_ids == []


def test_split_sizes_are_balanced():
    assert get_split_sizes(7, 3) == [3, 2, 2]
    assert get_split_sizes(5, 4) == [2, 1, 1, 1]
    assert get_split_sizes(2, 4) == [1, 1]
    assert get_split_sizes(1, 3) == [1]
    assert sum(get_split_sizes(1001, 7)) == 1001


class WhoAmI(nn.Module):
    def forward(self, x):
        context = get_replica_context()
        index = -1 if context is None else context.index
        return {"index": torch.full((x.shape[0],), index), "device": str(x.device), "x": x}


def test_replicas_run_in_device_order():
    outputs = DataParallelModel(WhoAmI(), CPU3)(torch.arange(7.0))
    assert [o["index"].tolist() for o in outputs] == [[0, 0, 0], [1, 1], [2, 2]]
    assert [o["x"].tolist() for o in outputs] == [[0.0, 1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert [o["device"] for o in outputs] == ["cpu"] * 3


def test_fewer_samples_than_devices_and_batch_of_one():
    net = nn.Linear(3, 2).double()
    model, criterion = DataParallelModel(net, ["cpu"] * 4), DataParallelCriterion(nn.MSELoss(), ["cpu"] * 4)
    for n in (1, 2, 3):
        x, y = torch.randn(n, 3, dtype=torch.float64), torch.randn(n, 2, dtype=torch.float64)
        outputs = model(x)
        assert len(outputs) == n and outputs.split_sizes == [1] * n
        torch.testing.assert_close(criterion(outputs, y), F.mse_loss(net(x), y), **TOL)


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    names: PerSample
    scale: float = 1.0


Pair = collections.namedtuple("Pair", ["left", "right"])


class Nested(nn.Module):
    def forward(self, sample, pair, extra=None, *, mask=None, tag="t"):
        return {"sum": sample.image * sample.scale + pair.left + pair.right[0] + mask,
                "names": sample.names, "tag": tag, "extra": extra, "pair": Pair(pair.left, None)}


def test_nested_structures_per_sample_and_kwargs():
    x = torch.arange(7.0).view(7, 1)
    names = PerSample([f"img{i}.jpg" for i in range(7)])
    sample = Sample(x, names, 2.0)
    pair = Pair(x + 1, [x + 2, "keep"])
    outputs = DataParallelModel(Nested(), CPU3)(sample, pair, None, mask=x * 0, tag="hello")
    assert [o["names"] for o in outputs] == [names[:3], names[3:5], names[5:]]
    assert all(isinstance(o["names"], PerSample) and o["tag"] == "hello" and o["extra"] is None for o in outputs)
    assert all(isinstance(o["pair"], Pair) and o["pair"].right is None for o in outputs)
    full = gather(outputs, "cpu")
    torch.testing.assert_close(full["sum"], x * 2 + (x + 1) + (x + 2))
    assert full["names"] == names and isinstance(full["names"], PerSample)
    assert full["tag"] == "hello" and full["extra"] is None


def test_kwargs_only_and_zero_arg_modules():
    class KwOnly(nn.Module):
        def forward(self, *, a, b):
            return a * b

    class NoArgs(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self):
            return self.w * 3

    a, b = torch.randn(5, 2), torch.randn(5, 2)
    outputs = DataParallelModel(KwOnly(), CPU3)(a=a, b=b)
    assert outputs.split_sizes == [2, 2, 1]
    torch.testing.assert_close(torch.cat(list(outputs)), a * b)
    outputs = DataParallelModel(NoArgs(), CPU3)()
    assert len(outputs) == 1 and outputs[0].tolist() == [3.0, 3.0]


def test_mismatched_splits_raise_clearly():
    model = DataParallelModel(WhoAmI(), CPU3)
    with pytest.raises(ValueError, match=r"split differently.*7.*6"):
        model(torch.zeros(7), mask=torch.zeros(6))
    with pytest.raises(ValueError, match="split differently"):
        scatter((torch.zeros(4), PerSample(["a"] * 3)), CPU3)
    outputs = DataParallelModel(nn.Linear(2, 2), CPU3)(torch.zeros(7, 2))
    with pytest.raises(ValueError, match=r"sum to 7 but the batch has 6"):
        DataParallelCriterion(nn.MSELoss(), CPU3)(outputs, torch.zeros(6, 2))


def test_unbatched_tensors_are_fine_when_nothing_is_split():
    """Like torch's DataParallel, [] and one device call the module directly: no split, so no size check."""

    class Scaled(nn.Module):
        def forward(self, x, scale):
            return x * scale

    x, scale = torch.ones(5, 3), torch.tensor([1.0, 2.0, 3.0])
    for device_ids in ([], ["cpu"]):
        outputs = DataParallelModel(Scaled(), device_ids)(x, scale)
        torch.testing.assert_close(outputs[0], x * scale)
        assert outputs.split_sizes == [None]
    with pytest.raises(ValueError, match="split differently"):
        DataParallelModel(Scaled(), ["cpu"] * 2)(x, scale)


def test_criterion_uses_model_split_not_a_fresh_chunking():
    """Targets follow the model's split even when outputs came from fewer replicas than the criterion's devices."""
    net = nn.Linear(3, 2).double()
    x, y = torch.randn(5, 3, dtype=torch.float64), torch.randn(5, 2, dtype=torch.float64)
    outputs = DataParallelModel(net, ["cpu"] * 2)(x)  # [3, 2]
    loss = DataParallelCriterion(nn.MSELoss(), ["cpu"] * 4)(outputs, y)  # a fresh split would be [2, 1, 1, 1]
    torch.testing.assert_close(loss, F.mse_loss(net(x), y), **TOL)
    plain_list = [o for o in outputs]  # a plain list: sizes inferred from the outputs
    torch.testing.assert_close(DataParallelCriterion(nn.MSELoss(), [])(plain_list, y), loss, **TOL)


@pytest.mark.parametrize("spelling", ["cpu:0", torch.device("cpu", 0)])
def test_every_spelling_of_the_cpu_is_the_device_of_cpu_tensors(spelling):
    """CPU tensors report ``cpu`` with no index: ``"cpu:0"`` resolves to it, so a module on the CPU can be wrapped."""
    assert resolve_device(spelling) == torch.device("cpu") == torch.zeros(1).to(spelling).device
    model = DataParallelModel(nn.Linear(4, 2).to(spelling), [spelling, spelling])
    assert [o.shape[0] for o in model(torch.randn(5, 4))] == [3, 2]


def test_parameters_must_live_on_first_device():
    with pytest.raises(ValueError, match="CUDA is not available|only"):
        if torch.cuda.is_available():
            DataParallelModel(nn.Linear(1, 1), [torch.cuda.device_count()])
        else:
            DataParallelModel(nn.Linear(1, 1), [0])
    if torch.cuda.is_available():
        with pytest.raises(RuntimeError, match=r"parameter 'weight' is on cpu"):
            DataParallelModel(nn.Linear(1, 1), [0])(torch.zeros(2, 1))


def test_train_step_and_val_step_forward_through_replicas():
    class Steps(nn.Module):
        def forward(self, x):
            return x

        def train_step(self, x):
            return {"loss": x.sum(), "index": get_replica_context().index}

        def val_step(self, x):
            return x * 2

    model = DataParallelModel(Steps(), CPU3)
    out = model.train_step(torch.ones(7))
    assert [o["index"] for o in out] == [0, 1, 2] and [o["loss"].item() for o in out] == [3.0, 2.0, 2.0]
    assert torch.equal(model.gather(model.val_step(torch.ones(4))), torch.full((4,), 2.0))
    with pytest.raises(AttributeError, match="no 'train_step'"):
        DataParallelModel(nn.Linear(1, 1), CPU3).train_step(torch.ones(2, 1))


# --------------------------------------------------------------------------------------------------- thread state


def test_autocast_dtype_reaches_every_replica():
    net = nn.Linear(8, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = DataParallelModel(net, CPU3)(torch.randn(7, 8))
    assert [o.dtype for o in outputs] == [torch.bfloat16] * 3


def test_no_grad_and_inference_mode_keep_no_graph():
    net = nn.Linear(8, 4)
    with torch.no_grad():
        outputs = DataParallelModel(net, CPU3)(torch.randn(7, 8))
    assert all(o.grad_fn is None and not o.requires_grad for o in outputs)
    with torch.inference_mode():
        outputs = DataParallelModel(net, CPU3)(torch.randn(7, 8))
    assert all(o.is_inference() for o in outputs)
    outputs = DataParallelModel(net, CPU3)(torch.randn(7, 8))
    assert all(o.requires_grad for o in outputs)


# --------------------------------------------------------------------------------------------------- faults


class FailOn(nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index

    def forward(self, x):
        if get_replica_context().index == self.index:
            raise KeyError("bad sample in this replica")
        return x


def test_replica_exception_keeps_type_index_and_traceback():
    with pytest.raises(KeyError) as info:
        DataParallelModel(FailOn(1), CPU3)(torch.zeros(7))
    err = info.value
    assert err.replica_index == 1 and err.replica_device == torch.device("cpu")
    note = "\n".join(err.__notes__)
    assert "replica 1 on device cpu" in note
    assert 'raise KeyError("bad sample in this replica")' in note


def test_waiting_replica_is_released_and_original_error_wins():
    """A replica waiting on a failed one raises ReplicaAbortedError; the caller sees the real failure."""

    class Waits(nn.Module):
        def forward(self, x):
            context = get_replica_context()
            if context.index == 2:
                raise ValueError("replica 2 broke")
            if not context.failed.wait(timeout=10):
                return x
            raise ReplicaAbortedError(f"replica {context.index} gave up waiting")

    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("exc", _capture(Waits())))
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert isinstance(result["exc"], ValueError) and result["exc"].replica_index == 2


def _capture(module):
    try:
        DataParallelModel(module, CPU3)(torch.zeros(7))
    except BaseException as exc:  # noqa: BLE001
        return exc
    return None


def test_no_reference_cycles_after_forward_and_backward():
    net = SmallNet(dict_output=True).double()
    model, criterion = DataParallelModel(net, CPU3), DataParallelCriterion(MainAuxLoss(), CPU3)
    x, y = make_batch()
    criterion(model(x), y).backward()  # warm-up: lazily created module state
    gc.collect()
    gc.disable()
    try:
        criterion(model(x), y).backward()
        assert gc.collect() == 0
    finally:
        gc.enable()


# --------------------------------------------------------------------------------------------------- building blocks


def test_allreduce_sums_and_is_differentiable():
    a = torch.randn(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, dtype=torch.float64, requires_grad=True)
    d = torch.randn(2, dtype=torch.float64, requires_grad=True)
    out = allreduce(2, a, c, b, d)
    torch.testing.assert_close(out[0], a + b)
    torch.testing.assert_close(out[3], c + d)
    assert torch.autograd.gradcheck(lambda *t: allreduce(2, *t), (a, c, b, d))
    with pytest.raises(ValueError, match="multiple of num_inputs"):
        allreduce(2, a, b, c)


def test_broadcast_copies_of_tensors_without_grad_do_not_require_grad():
    a = torch.randn(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64)
    copies = broadcast([a, b], [torch.device("cpu")] * 3)
    assert [[t.requires_grad for t in replica] for replica in copies] == [[True, False]] * 3
    assert all(torch.equal(replica[1], b) for replica in copies)
    sum(replica[0] * (j + 1) for j, replica in enumerate(copies)).sum().backward()
    torch.testing.assert_close(a.grad, torch.full_like(a, 6.0), **TOL)


def test_lazy_module_with_uninitialized_parameters_is_refused_clearly():
    with pytest.raises(RuntimeError, match="uninitialized parameters can't be used with DataParallel"):
        DataParallelModel(nn.LazyLinear(3), CPU3)(torch.randn(6, 4))
    lazy = nn.LazyLinear(3).double()
    x = torch.randn(6, 4, dtype=torch.float64)
    torch.testing.assert_close(torch.cat(list(DataParallelModel(lazy, [])(x))), lazy(x), **TOL)  # direct call inits
    torch.testing.assert_close(torch.cat(list(DataParallelModel(lazy, CPU3)(x))), lazy(x), **TOL)


def test_data_parallel_none_means_no_inputs():
    class Constant(nn.Module):
        def __init__(self):
            super().__init__()
            self.value = nn.Parameter(torch.ones(2, dtype=torch.float64))

        def forward(self):
            return self.value * 3

    torch.testing.assert_close(data_parallel(Constant(), None, CPU3), torch.full((2,), 3.0, dtype=torch.float64))


def test_minus_one_is_the_cpu_like_torch_gather():
    parts = [torch.ones(2, 3), torch.zeros(1, 3)]
    assert gather(parts, -1).device == torch.device("cpu")
    net = nn.Linear(4, 2).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    torch.testing.assert_close(data_parallel(net, x, CPU3, output_device=-1), net(x), **TOL)
    assert DataParallelModel(net, [-1, -1]).device_ids == [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match="negative"):
        gather(parts, -2)


class Recorder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.calls = []

    def __data_parallel_replicate__(self, ctx, copy_id):
        if copy_id == 0:
            ctx.queue = []
        ctx.queue.append(copy_id)
        self.record = (ctx, copy_id)


def test_replication_callbacks_master_first_with_shared_context():
    root = nn.Sequential(Recorder(), nn.ReLU(), Recorder())
    replicas = replicate(root, CPU3)
    first = [r[0].record for r in replicas]
    second = [r[2].record for r in replicas]
    assert [c for _, c in first] == [0, 1, 2]
    assert len({id(ctx) for ctx, _ in first}) == 1 and len({id(ctx) for ctx, _ in second}) == 1
    assert first[0][0] is not second[0][0] and isinstance(first[0][0], CallbackContext)
    assert first[0][0].queue == [0, 1, 2]
    assert list(replicas[1].parameters()) == []


def test_patch_replication_callback_wraps_replicate(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # torch's DataParallel([]) needs a CPU-only machine
    dp = nn.DataParallel(Recorder(), device_ids=[])
    monkeypatch.undo()
    dp.replicate = lambda module, device_ids: replicate(module, device_ids, callbacks=False)
    patch_replication_callback(dp)
    replicas = dp.replicate(dp.module, ["cpu", "cpu"])
    assert [r.record[1] for r in replicas] == [0, 1]
    with pytest.raises(TypeError, match="DataParallel"):
        patch_replication_callback(nn.Linear(1, 1))


def test_data_parallel_model_is_a_torch_data_parallel_with_device_agnostic_ids():
    net = nn.Linear(4, 2).double()
    model = DataParallelModel(net, CPU3)
    assert isinstance(model, nn.DataParallel)
    assert (model.module if isinstance(model, nn.DataParallel) else model) is net
    assert model.device_ids == [torch.device("cpu")] * 3  # torch's __init__ would reset them to [] without CUDA
    assert model.src_device_obj == torch.device("cpu") and model.output_device == torch.device("cpu")
    assert list(model.state_dict()) == ["module.weight", "module.bias"]
    assert DataParallelModel(net, []).src_device_obj is None


class Overridden(DataParallelModel):
    """torch-style overrides of the four steps, recording that each one ran."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def scatter(self, inputs, kwargs, device_ids):
        self.calls.append(("scatter", len(device_ids)))
        return super().scatter(inputs, kwargs, device_ids)

    def replicate(self, module, device_ids):
        self.calls.append(("replicate", len(device_ids)))
        return super().replicate(module, device_ids)

    def parallel_apply(self, replicas, inputs, kwargs, devices=None):
        self.calls.append(("parallel_apply", len(replicas)))
        return super().parallel_apply(replicas, inputs, kwargs, devices)


def test_scatter_replicate_parallel_apply_are_overridable_methods():
    net = nn.Linear(4, 2).double()
    model = Overridden(net, CPU3)
    x = torch.randn(7, 4, dtype=torch.float64)
    outputs = model(x)
    assert model.calls == [("scatter", 3), ("replicate", 3), ("parallel_apply", 3)]
    assert outputs.split_sizes == [3, 2, 2]
    torch.testing.assert_close(model.gather(outputs, -1), net(x), **TOL)


def test_data_parallel_with_callback_replicates_on_cpu_and_gathers():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).double()
    synced = copy.deepcopy(plain)
    synced[1] = SyncBatchNorm(3).double()
    synced[1].load_state_dict(plain[1].state_dict())
    model = DataParallelWithCallback(synced, ["cpu", "cpu"])
    assert isinstance(model, nn.DataParallel)
    x = torch.randn(7, 4, dtype=torch.float64)
    out = model(x)
    assert isinstance(out, torch.Tensor)  # gathered, like torch's DataParallel
    torch.testing.assert_close(out, plain(x), **TOL)  # statistics of the whole batch: the replicas synchronised
    torch.testing.assert_close(synced[1].running_var, plain[1].running_var, **TOL)


def test_patch_replication_callback_accepts_our_wrapper_and_calls_callbacks_once():
    root = nn.Sequential(Recorder(), Recorder())
    model = patch_replication_callback(DataParallelModel(root, CPU3))
    replicas = model.replicate(root, CPU3)
    assert [r[0].record[1] for r in replicas] == [0, 1, 2]
    assert replicas[0][0].record[0].queue == [0, 1, 2]  # once per copy, not twice
    bn = SyncBatchNorm(3).double()
    model = patch_replication_callback(DataParallelModel(bn, CPU3))
    x = torch.randn(7, 3, dtype=torch.float64)
    torch.testing.assert_close(torch.cat(list(model(x))), F.batch_norm(x, None, None, training=True), **TOL)


def test_parallel_apply_standalone():
    outs = parallel_apply([lambda t: t + 1, lambda t: t * 2], [torch.ones(1), torch.ones(1)])
    assert [o.item() for o in outs] == [2.0, 2.0]


def test_batchnorm_running_stats_persist_from_master_replica():
    bn = nn.BatchNorm1d(3).double()
    x = torch.randn(6, 3, dtype=torch.float64)
    DataParallelModel(bn, CPU3)(x)
    ref = nn.BatchNorm1d(3).double()
    ref(x[:2])
    torch.testing.assert_close(bn.running_mean, ref.running_mean)


# --------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_cuda_equivalence():
    devices = list(range(torch.cuda.device_count())) * (1 if torch.cuda.device_count() > 1 else 2)
    devices = devices if torch.cuda.device_count() > 1 else ["cuda:0"] * 3
    net = SmallNet(dict_output=True).double().cuda()
    x, y = make_batch()
    x, y = x.cuda(), y.cuda()
    criterion = MainAuxLoss()
    ref = criterion(net(x), y)
    outputs = DataParallelModel(net, devices)(x)
    assert all(o["out"].is_cuda for o in outputs)
    loss = DataParallelCriterion(criterion, devices)(outputs, y)
    torch.testing.assert_close(loss, ref, **TOL)
    assert_all_close(grads(loss, net), grads(ref, net))


@pytest.mark.gpu
def test_cuda_mixed_with_cpu_devices():
    net = SmallNet().double().cuda()
    x, y = make_batch()
    criterion = nn.CrossEntropyLoss(ignore_index=-1)
    ref = criterion(net(x.cuda()), y.cuda())
    outputs = DataParallelModel(net, ["cuda:0", "cpu", "cuda:0"])(x)
    assert [o.device.type for o in outputs] == ["cuda", "cpu", "cuda"]
    loss = DataParallelCriterion(criterion, ["cuda:0", "cpu", "cuda:0"])(outputs, y)
    torch.testing.assert_close(loss, ref, **TOL)
    assert_all_close(grads(loss, net), grads(ref, net))


@pytest.mark.gpu
def test_cuda_output_key_aux_weight_and_whole_batch_fallback():
    """Torch loss with output_key/aux_weight, and a lambda whose last replica is all ignored (gathered onto the
    output device), on replicas split between a GPU and the CPU."""
    devices = ["cuda:0", "cpu", "cuda:0"]
    net = SmallNet(dict_output=True).double().cuda()
    x, y = make_batch()
    y[5:] = -1
    ce = nn.CrossEntropyLoss(ignore_index=-1, weight=WEIGHT.cuda())
    whole = net(x.cuda())
    ref = ce(whole["out"], y.cuda()) + 0.5 * ce(whole["aux"], y.cuda())
    loss = DataParallelCriterion(ce, devices, output_key="out", aux_weight=0.5)(DataParallelModel(net, devices)(x), y)
    assert loss.device.type == "cuda"
    torch.testing.assert_close(loss, ref, **TOL)
    assert_all_close(grads(loss, net), grads(ref, net))
    function = lambda out, t: F.cross_entropy(out["out"], t, ignore_index=-1)  # noqa: E731
    with pytest.warns(InexactReductionWarning):
        loss = DataParallelCriterion(function, devices)(DataParallelModel(net, devices)(x), y)
    torch.testing.assert_close(loss, function(whole, y.cuda()), **TOL)


@pytest.mark.gpu
def test_cuda_autocast_dtype_in_replicas():
    net = nn.Linear(8, 4).cuda()
    devices = ["cuda:0"] * 2 if torch.cuda.device_count() == 1 else [0, 1]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        outputs = DataParallelModel(net, devices)(torch.randn(6, 8, device="cuda"))
    assert [o.dtype for o in outputs] == [torch.bfloat16] * 2


@pytest.mark.gpu
def test_cuda_broadcast_marks_constants_like_the_cpu_path():
    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    a = torch.randn(3, device=devices[0], requires_grad=True)
    b = torch.randn(3, device=devices[0])
    copies = broadcast([a, b], devices)
    assert [[t.requires_grad for t in replica] for replica in copies] == [[True, False]] * len(devices)
