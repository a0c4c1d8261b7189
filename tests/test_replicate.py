"""Our fast ``replicate`` (``_shallow_copy`` + direct ``__dict__`` filling) against torch's own replication.

torch's ``torch.nn.parallel.replicate`` needs CUDA for its broadcast, so on CPU the reference is torch's *own
replication loop* (``Module._replicate_for_data_parallel`` per submodule, then ``setattr`` of children,
parameters and buffers) with only its two device helpers redirected to the CPU: a torch upgrade that changes what
a replica looks like (new ``Module`` state, a class overriding ``_replicate_for_data_parallel`` or ``__setattr__``)
breaks a test here, not a user. A ``gpu`` test compares with the unmodified torch function.
"""
import importlib

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations

from encoding.parallel import broadcast, replicate
from encoding.parallel.devices import resolve_devices

TORCH_REPLICATE = importlib.import_module("torch.nn.parallel.replicate")
TOL = dict(rtol=0, atol=1e-6)
#: What our replicas carry that torch's do not: the mark that replication callbacks ran (on the root only).
OUR_EXTRA_STATE = {"_replication_callbacks_done"}


def _hooked():
    layer = nn.Linear(4, 3, bias=False).double()
    layer.register_forward_pre_hook(lambda module, args: (args[0] * 2,))
    layer.register_forward_hook(lambda module, args, output: output + 1)
    return nn.Sequential(layer, nn.BatchNorm1d(3, track_running_stats=False).double()), torch.randn(5, 4)


def _lazy():
    net = nn.Sequential(nn.LazyLinear(4), nn.ReLU(), nn.LazyBatchNorm1d()).double()
    net(torch.randn(2, 6, dtype=torch.float64))  # initialised: LazyLinear became a Linear
    return net, torch.randn(5, 6)


ZOO = {
    "batchnorm": lambda: (nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).double(),
                          torch.randn(4, 3, 5, 5)),
    "lstm": lambda: (nn.LSTM(3, 4, num_layers=2, batch_first=True).double(), torch.randn(2, 5, 3)),
    "lazy": _lazy,
    "parametrized": lambda: (parametrizations.weight_norm(nn.Linear(4, 3).double()), torch.randn(5, 4)),
    "hooks": _hooked,
}


@pytest.fixture
def torch_replicate_on_cpu(monkeypatch):
    """torch's ``replicate`` with its device-index check and CUDA broadcast redirected to CPU copies."""
    monkeypatch.setattr(TORCH_REPLICATE, "_get_device_index", lambda device, optional=False: device)
    monkeypatch.setattr(TORCH_REPLICATE, "_broadcast_coalesced_reshape",
                        lambda tensors, devices, detach=False: broadcast(tensors, resolve_devices(devices), detach))
    return TORCH_REPLICATE.replicate


def _flat(output):
    if isinstance(output, torch.Tensor):
        return [output]
    return [t for item in output for t in _flat(item)]


def _assert_same_replica(ours, theirs, original):
    assert [(n, type(m)) for n, m in ours.named_modules()] == [(n, type(m)) for n, m in theirs.named_modules()]
    for mine, ref, source in zip(ours.modules(), theirs.modules(), original.modules()):
        assert set(mine.__dict__) - OUR_EXTRA_STATE == set(ref.__dict__), type(source).__name__
        assert mine._is_replica and ref._is_replica
        assert mine._parameters == ref._parameters  # empty, or None entries only
        assert list(mine._buffers) == list(ref._buffers) and list(mine._modules) == list(ref._modules)
        assert list(mine._former_parameters) == list(ref._former_parameters) == [
            key for key, param in source._parameters.items() if param is not None]
        for key in source._parameters:
            if source._parameters[key] is not None:
                assert mine.__dict__[key] is mine._former_parameters[key]
                assert not mine.__dict__[key].is_leaf and torch.equal(mine.__dict__[key], ref.__dict__[key])
        for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks"):
            # the same hooks as torch's replica, in a dictionary of the replica's own (issue 34: a replica that
            # registers a hook must not add it to the original)
            assert getattr(mine, hooks) == getattr(source, hooks) == getattr(ref, hooks)
            assert getattr(mine, hooks) is not getattr(source, hooks)
        if hasattr(source, "_flat_weights_names"):  # RNNs: the flat-weight cache must hold the replica's copies
            assert all(w is getattr(mine, name) for w, name in zip(mine._flat_weights, mine._flat_weights_names))
            assert all(w is getattr(ref, name) for w, name in zip(ref._flat_weights, ref._flat_weights_names))
    assert list(ours.parameters()) == list(theirs.parameters()) == []


@pytest.mark.parametrize("name", list(ZOO))
def test_replicas_match_torchs_replication(name, torch_replicate_on_cpu):
    torch.manual_seed(0)
    module, x = ZOO[name]()
    x = x.double()
    devices = ["cpu"] * 3
    expected = _flat(module(x))
    ours = replicate(module, devices)
    theirs = torch_replicate_on_cpu(module, devices)
    for mine, ref in zip(ours, theirs):
        _assert_same_replica(mine, ref, module)
        for a, b, c in zip(_flat(mine(x)), _flat(ref(x)), expected):
            torch.testing.assert_close(a, c, **TOL)
            torch.testing.assert_close(b, c, **TOL)


@pytest.mark.parametrize("name", list(ZOO))
def test_replica_gradients_reach_the_original_parameters_like_torchs(name, torch_replicate_on_cpu):
    torch.manual_seed(1)
    module, x = ZOO[name]()
    x = x.double()
    params = list(module.parameters())
    gradients = []
    for replicate_fn in (replicate, torch_replicate_on_cpu):
        replicas = replicate_fn(module, ["cpu"] * 2)
        loss = sum(out.pow(2).sum() for r in replicas for out in _flat(r(x)))
        gradients.append(torch.autograd.grad(loss, params))
    plain = torch.autograd.grad(sum(out.pow(2).sum() for out in _flat(module(x))), params)
    for ours, theirs, single in zip(*gradients, plain):
        torch.testing.assert_close(ours, theirs, **TOL)
        torch.testing.assert_close(ours, 2 * single, **TOL)


def test_uninitialized_lazy_modules_are_refused_like_torch():
    with pytest.raises(RuntimeError, match="uninitialized parameters can't be used with"):
        replicate(nn.Sequential(nn.LazyLinear(3)), ["cpu"] * 2)
    with pytest.raises(RuntimeError, match="uninitialized parameters can't be used with"):
        nn.LazyLinear(3)._replicate_for_data_parallel()


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ZOO))
def test_replicas_match_torchs_replicate_on_cuda(name):
    torch.manual_seed(2)
    module, x = ZOO[name]()
    module, x = module.cuda(), x.double().cuda()
    devices = list(range(torch.cuda.device_count()))
    expected = _flat(module(x))
    ours = replicate(module, devices)
    theirs = torch.nn.parallel.replicate(module, devices)
    for j, (mine, ref) in enumerate(zip(ours, theirs)):
        _assert_same_replica(mine, ref, module)
        x_j = x.to(f"cuda:{devices[j]}")
        for a, b, c in zip(_flat(mine(x_j)), _flat(ref(x_j)), expected):
            torch.testing.assert_close(a.cpu(), c.cpu(), **TOL)
            torch.testing.assert_close(b.cpu(), c.cpu(), **TOL)
