"""SyncBatchNorm against plain full-batch BatchNorm (float64, CPU): replicas, processes (gloo), single device."""
import copy
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

import encoding.nn.syncbn as syncbn_module
from encoding.nn import SyncBatchNorm, convert_sync_batchnorm
from encoding.parallel import DataParallelCriterion, DataParallelModel, get_replica_context
from encoding.utils.dist import end_worker
from equivalence import assert_same_sgd_step

DEVICES = ["cpu"] * 3
ATOL = 1e-10


def close(got, want, atol=ATOL):
    torch.testing.assert_close(got, want, rtol=0, atol=atol)


def _net():
    """A conv net exercising BatchNorm on (N,C,H,W), (N,C,L) and (N,C), with momentum=None and affine=False."""
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        nn.Conv2d(6, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6, momentum=None), nn.ReLU(),
        nn.Flatten(2), nn.BatchNorm1d(6, affine=False),
        nn.Flatten(1), nn.Linear(6 * 16, 5), nn.BatchNorm1d(5),
    ).double()


def _bn_state(net):
    return {k: v for k, v in net.state_dict().items() if "running" in k or "num_batches" in k}


def test_replicas_match_full_batch_batchnorm_over_three_sgd_steps():
    torch.manual_seed(0)
    plain = _net()
    sync = convert_sync_batchnorm(copy.deepcopy(plain))
    assert sum(isinstance(m, SyncBatchNorm) for m in sync.modules()) == 4
    model = DataParallelModel(sync, DEVICES)
    criterion = DataParallelCriterion(nn.CrossEntropyLoss(), DEVICES)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_sync = torch.optim.SGD(sync.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(7, 3, 4, 4, dtype=torch.float64) * 2 + 1
    target = torch.randint(0, 5, (7,))
    seen = {}

    def plain_loss(x_plain):
        seen["out"] = plain(x_plain)
        return F.cross_entropy(seen["out"], target)

    def parallel_loss(x_sync):  # runs after plain_loss
        outputs = model(x_sync)
        assert [o.shape[0] for o in outputs] == [3, 2, 2]
        close(torch.cat(list(outputs)), seen["out"])
        return criterion(outputs, target)
    for _ in range(3):
        assert_same_sgd_step(plain, sync, x, plain_loss, parallel_loss, (opt_plain, opt_sync), close)
    for key, value in _bn_state(plain).items():
        close(sync.state_dict()[key], value)
    assert sync[1].num_batches_tracked.item() == 3
    plain.eval()
    sync.eval()
    close(torch.cat(list(model(x))), plain(x))


@pytest.mark.parametrize("shape", [(7, 4), (7, 4, 5), (7, 4, 3, 2), (7, 4, 2, 3, 2)], ids=["NC", "NCL", "NCHW", "NCDHW"])
@pytest.mark.parametrize("affine,momentum", [(True, 0.1), (False, None)])
def test_any_input_dim_on_replicas(shape, affine, momentum):
    torch.manual_seed(1)
    reference_cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[len(shape)]
    plain = reference_cls(4, affine=affine, momentum=momentum).double()
    sync = SyncBatchNorm(4, affine=affine, momentum=momentum).double()
    if affine:
        with torch.no_grad():
            for p, q in zip(plain.parameters(), sync.parameters()):
                p.uniform_(0.5, 2.0)
                q.copy_(p)
    x = torch.randn(*shape, dtype=torch.float64) * 3 - 2
    weight = torch.randn(*shape, dtype=torch.float64)
    x_plain, x_sync = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_plain = plain(x_plain)
    outputs = DataParallelModel(sync, DEVICES)(x_sync)
    close(torch.cat(list(outputs)), out_plain)
    (out_plain * weight).sum().backward()
    sum((o * w).sum() for o, w in zip(outputs, weight.split([3, 2, 2]))).backward()
    close(x_sync.grad, x_plain.grad)
    for p, q in zip(plain.parameters(), sync.parameters()):
        close(q.grad, p.grad)
    close(sync.running_mean, plain.running_mean)
    close(sync.running_var, plain.running_var)


@pytest.mark.parametrize("shape", [(6, 3), (6, 3, 5), (6, 3, 4, 4), (6, 3, 2, 3, 2)])
@pytest.mark.parametrize("kwargs", [{}, {"momentum": None}, {"affine": False}, {"track_running_stats": False}])
def test_single_device_is_batchnorm(shape, kwargs):
    torch.manual_seed(2)
    reference_cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d, 5: nn.BatchNorm3d}[len(shape)]
    plain = reference_cls(3, **kwargs).double()
    sync = SyncBatchNorm(3, **kwargs).double()
    for step in range(2):
        x = torch.randn(*shape, dtype=torch.float64) + step
        x_plain, x_sync = x.clone().requires_grad_(), x.clone().requires_grad_()
        out_plain, out_sync = plain(x_plain), sync(x_sync)
        assert torch.equal(out_sync, out_plain)
        out_plain.pow(2).sum().backward()
        out_sync.pow(2).sum().backward()
        assert torch.equal(x_sync.grad, x_plain.grad)
    for a, b in zip(plain.buffers(), sync.buffers()):
        assert torch.equal(a, b)
    plain.eval()
    sync.eval()
    assert torch.equal(sync(x), plain(x))
    assert torch.equal(torch.cat(list(DataParallelModel(sync, ["cpu"])(x))), plain(x))


def test_float32_statistics_are_stable_with_a_large_mean():
    torch.manual_seed(3)
    x = torch.randn(8, 2, 16, 16) + 3000.0  # E[x^2] - E[x]^2 in float32 would lose the variance entirely
    reference = F.batch_norm(x.double(), None, None, training=True).float()
    outputs = DataParallelModel(SyncBatchNorm(2), ["cpu"] * 2)(x)
    close(torch.cat(list(outputs)), reference, atol=1e-3)


def test_channels_last_bfloat16_backward_matches_batchnorm():
    """The gradient keeps the input's memory format: torch's CPU kernel would otherwise sum grad_bias in bf16."""
    torch.manual_seed(5)
    x = torch.randn(4, 8, 10, 10).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    g = torch.randn(4, 8, 10, 10).to(torch.bfloat16)
    plain, sync = nn.BatchNorm2d(8), SyncBatchNorm(8)
    x_plain, x_sync = x.contiguous().requires_grad_(), x.clone().requires_grad_()
    (plain(x_plain).float() * g.float()).sum().backward()
    outputs = DataParallelModel(sync, ["cpu"] * 2)(x_sync)
    assert all(o.is_contiguous(memory_format=torch.channels_last) for o in outputs)
    (torch.cat(list(outputs)).float() * g.float()).sum().backward()
    close(sync.bias.grad, plain.bias.grad, atol=1e-4)
    close(sync.weight.grad, plain.weight.grad, atol=1e-4)
    close(x_sync.grad.float(), x_plain.grad.float(), atol=2 ** -6)


@pytest.mark.parametrize("replicas", [1, 3])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_mixed_bfloat16_matches_batchnorm_within_torch_tolerance(replicas, memory_format):
    """bf16 input, float32 parameters (mixed): output, input gradient and running statistics are nn.BatchNorm2d's
    within torch's own bf16 tolerance. Both input-gradient terms (direct and through the statistics) are summed in
    float32 and rounded once, as torch's kernel does (rounding them apart made 12 of 3200 elements differ)."""
    torch.manual_seed(5)
    x = torch.randn(4, 8, 10, 10).to(torch.bfloat16).contiguous(memory_format=memory_format)
    g = torch.randn(4, 8, 10, 10).to(torch.bfloat16).contiguous(memory_format=memory_format)
    plain, sync = nn.BatchNorm2d(8), SyncBatchNorm(8)
    x_plain, x_sync = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_plain = plain(x_plain)
    out_plain.backward(g)
    out_sync = torch.cat(list(DataParallelModel(sync, ["cpu"] * replicas)(x_sync)))
    out_sync.backward(g)
    assert x_sync.grad.dtype == torch.bfloat16
    torch.testing.assert_close(out_sync, out_plain)  # bf16 defaults: rtol 1.6e-2, atol 1e-5
    torch.testing.assert_close(x_sync.grad, x_plain.grad)
    for a, b in ((sync.weight.grad, plain.weight.grad), (sync.bias.grad, plain.bias.grad),
                 (sync.running_mean, plain.running_mean), (sync.running_var, plain.running_var)):
        torch.testing.assert_close(a, b)  # float32 defaults


def test_layer_called_twice_per_forward():
    torch.manual_seed(4)
    plain_bn, sync_bn = nn.BatchNorm2d(3).double(), SyncBatchNorm(3).double()
    conv = nn.Conv2d(3, 3, 1).double()
    plain = nn.Sequential(plain_bn, conv, plain_bn)
    sync = nn.Sequential(sync_bn, copy.deepcopy(conv), sync_bn)
    x = torch.randn(5, 3, 4, 4, dtype=torch.float64)
    close(torch.cat(list(DataParallelModel(sync, DEVICES)(x))), plain(x))
    close(sync_bn.running_var, plain_bn.running_var)
    assert sync_bn.num_batches_tracked.item() == 2


def test_gradcheck_through_the_replica_sync():
    torch.manual_seed(7)
    bn = SyncBatchNorm(3).double()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-1.0, 1.0)
    model = DataParallelModel(bn, DEVICES)
    x = torch.randn(7, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: torch.cat(list(model(t))), (x,))


def _penalty(output, input):
    """A gradient penalty (WGAN-GP): ``|d output / d input|^2``, differentiated once more by its caller."""
    grad, = torch.autograd.grad(output, input, grad_outputs=torch.ones_like(output), create_graph=True)
    return grad.square().sum()


def test_double_backward_through_the_replica_sync_matches_batchnorm():
    """A gradient of a gradient (``create_graph=True``) through the synchronised statistics: the penalty and its
    parameter gradients equal plain BatchNorm's on the whole batch."""
    torch.manual_seed(3)
    plain = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 1)).double()
    with torch.no_grad():
        plain[1].weight.uniform_(0.5, 2.0)
        plain[1].bias.uniform_(-1.0, 1.0)
    sync = convert_sync_batchnorm(copy.deepcopy(plain))
    x = torch.randn(7, 4, dtype=torch.float64)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = _penalty(plain(xa), xa)
    got = _penalty(torch.cat(list(DataParallelModel(sync, DEVICES)(xb))), xb)
    close(got, want)
    named = [(n, p) for n, p in plain.named_parameters() if n != "3.bias"]  # the penalty does not reach 3.bias
    want_grads = torch.autograd.grad(want, [p for _, p in named])
    got_grads = torch.autograd.grad(got, [dict(sync.named_parameters())[n] for n, _ in named])
    for a, b in zip(got_grads, want_grads):
        close(a, b)


def test_eval_without_running_statistics_normalises_replicas_with_the_whole_batch():
    """``track_running_stats=False``: BatchNorm uses the batch's statistics in eval mode too, the whole batch's."""
    torch.manual_seed(4)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)).double().eval()
    sync = convert_sync_batchnorm(copy.deepcopy(plain)).eval()
    x = torch.randn(7, 3, 6, 6, dtype=torch.float64)
    close(torch.cat(list(DataParallelModel(sync, DEVICES)(x))), plain(x))


def test_convert_sync_batchnorm_keeps_parameters_stats_and_flags():
    inner = nn.Sequential(nn.Conv1d(2, 3, 1), nn.BatchNorm1d(3), nn.BatchNorm3d(3, affine=False))
    net = nn.Sequential(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2, eps=1e-3, momentum=None), inner,
                        nn.SyncBatchNorm(4), nn.BatchNorm2d(5, track_running_stats=False))
    net[1].weight.requires_grad_(False)
    with torch.no_grad():
        net[1].running_mean.fill_(0.5)
        net[1].num_batches_tracked.fill_(7)
    inner[1].eval()
    old = [net[1], inner[1], inner[2], net[3], net[4]]
    converted = convert_sync_batchnorm(net, process_group="group")
    assert converted is net
    new = [net[1], inner[1], inner[2], net[3], net[4]]
    assert all(type(m) is SyncBatchNorm for m in new)
    for o, n in zip(old, new):
        assert (n.num_features, n.eps, n.momentum, n.affine, n.track_running_stats, n.training) == \
            (o.num_features, o.eps, o.momentum, o.affine, o.track_running_stats, o.training)
        assert n.process_group == "group"
        for (name, a), b in zip(o.named_parameters(), n.parameters()):
            assert a is b and a.requires_grad == b.requires_grad, name
        for a, b in zip(o.buffers(), n.buffers()):
            assert a is b
    assert not net[1].weight.requires_grad and net[1].running_mean[0] == 0.5 and net[1].num_batches_tracked == 7
    assert net[4].running_mean is None
    single = SyncBatchNorm.convert_sync_batchnorm(nn.BatchNorm2d(3))
    assert type(single) is SyncBatchNorm and single.process_group is None


def test_bad_input_raises():
    with pytest.raises(ValueError, match="4 channels"):
        DataParallelModel(SyncBatchNorm(3), DEVICES)(torch.randn(6, 4, 2))
    with pytest.raises(ValueError, match="1D"):
        DataParallelModel(SyncBatchNorm(3), DEVICES)(torch.randn(6))


# -- failures never hang ------------------------------------------------------------------------------------------
class _Fail(nn.Module):
    def __init__(self, index):
        super().__init__()
        self.index = index

    def forward(self, x):
        if get_replica_context().index == self.index:
            time.sleep(0.2)  # the others are already waiting in the synchronisation
            raise ValueError(f"boom in replica {self.index}")
        return x


class _SkipOn(nn.Module):
    def __init__(self, index, layer):
        super().__init__()
        self.index, self.layer = index, layer

    def forward(self, x):
        return x if get_replica_context().index == self.index else self.layer(x)


def _run_bounded(fn, seconds=20.0):
    """Run ``fn`` in a daemon thread; fail the test if it does not finish in time. Returns its exception."""
    outcome = {}

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            outcome["exc"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "data-parallel forward hung"
    return outcome.get("exc"), time.monotonic() - start


def test_replica_failing_before_the_sync_does_not_hang():
    bn = SyncBatchNorm(3).double()
    bn.sync_timeout = 60.0  # must end through the failed event, not the timeout
    model = DataParallelModel(nn.Sequential(_Fail(1), bn), DEVICES)
    exc, elapsed = _run_bounded(lambda: model(torch.randn(7, 3, 2, dtype=torch.float64)))
    assert isinstance(exc, ValueError) and "boom in replica 1" in str(exc)
    assert elapsed < 10


def test_replica_failing_inside_the_sync_does_not_hang(monkeypatch):
    def exploding_allreduce(num_inputs, *inputs):
        raise RuntimeError("all-reduce exploded")

    monkeypatch.setattr(syncbn_module, "allreduce", exploding_allreduce)
    bn = SyncBatchNorm(3).double()
    bn.sync_timeout = 60.0
    exc, elapsed = _run_bounded(lambda: DataParallelModel(bn, DEVICES)(torch.randn(7, 3, dtype=torch.float64)))
    assert isinstance(exc, RuntimeError) and "all-reduce exploded" in str(exc)
    assert elapsed < 10


def test_replica_skipping_the_layer_times_out_naming_it():
    bn = SyncBatchNorm(3).double()
    bn.sync_timeout = 0.3
    model = DataParallelModel(_SkipOn(2, bn), DEVICES)
    exc, _ = _run_bounded(lambda: model(torch.randn(7, 3, dtype=torch.float64)))
    assert isinstance(exc, TimeoutError) and "replica(s) [2]" in str(exc)


# -- processes: 2-rank gloo DDP on CPU ----------------------------------------------------------------------------
WORLD, SPLITS, STEPS = 2, [4, 3], 2


def _ddp_data():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(sum(SPLITS), 3, 4, 4, generator=g, dtype=torch.float64) * 2 + 1
    weight = torch.randn(sum(SPLITS), 5, generator=g, dtype=torch.float64)
    return x, weight


def _train(net, x, weight, scale):
    """STEPS SGD steps of loss = scale * sum(net(x) * weight); returns outputs, input grads, param grads."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    record = {"out": [], "x_grad": [], "grads": []}
    for _ in range(STEPS):
        xi = x.clone().requires_grad_()
        out = net(xi)
        opt.zero_grad()
        (scale * (out * weight).sum()).backward()
        record["out"].append(out.detach())
        record["x_grad"].append(xi.grad)
        record["grads"].append([p.grad.clone() for p in net.parameters()])
        opt.step()
    return record


def _rank_penalty(net, x, weight):
    """``(penalty, its parameter gradients)`` of the gradient penalty of ``sum(net(x) * weight)``: summed over the
    ranks, the whole batch's (each rank's input gradient is that of the sum of the ranks' losses)."""
    x = x.clone().requires_grad_()
    grad, = torch.autograd.grad(net(x), x, grad_outputs=weight, create_graph=True)
    penalty = grad.square().sum()
    params = list(net.parameters())
    grads = torch.autograd.grad(penalty, params, allow_unused=True)  # the last bias does not reach the penalty
    return penalty.detach(), [torch.zeros_like(p) if g is None else g.detach() for g, p in zip(grads, params)]


def _ddp_worker(rank, init_file, out_dir, state):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        net = _net()
        net.load_state_dict(state)
        net = convert_sync_batchnorm(net, process_group=dist.new_group(list(range(WORLD))))
        ddp = nn.parallel.DistributedDataParallel(net)
        x, weight = _ddp_data()
        start = sum(SPLITS[:rank])
        part = slice(start, start + SPLITS[rank])
        record = _train(ddp, x[part], weight[part], 1.0)  # DDP averages gradients over the 2 ranks
        record["bn"] = {k: v.clone() for k, v in _bn_state(net).items()}  # before the penalty's forward
        record["penalty"] = _rank_penalty(net, x[part], weight[part])
        torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    end_worker(0)  # past the interpreter's teardown, where gloo's threads sometimes abort a finished rank


def test_two_process_gloo_ddp_matches_full_batch_batchnorm(tmp_path):
    torch.manual_seed(6)
    plain = _net()
    state = copy.deepcopy(plain.state_dict())
    mp.spawn(_ddp_worker, args=(str(tmp_path / "rendezvous"), str(tmp_path), state), nprocs=WORLD, join=True)
    x, weight = _ddp_data()
    expected = _train(plain, x, weight, 1.0 / WORLD)
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        start = sum(SPLITS[:rank])
        part = slice(start, start + SPLITS[rank])
        for step in range(STEPS):
            close(got["out"][step], expected["out"][step][part])
            # input grads are d(sum of the ranks' losses)/dx; DDP averages only the parameter grads
            close(got["x_grad"][step], WORLD * expected["x_grad"][step][part])
            for g, e in zip(got["grads"][step], expected["grads"][step]):
                close(g, e)
        for key, value in _bn_state(plain).items():
            torch.testing.assert_close(got["bn"][key], value, rtol=0, atol=ATOL)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)["penalty"] for rank in range(WORLD)]
    penalty, grads = _rank_penalty(plain.train(), x, weight)  # double backward: sums over the ranks
    close(sum(r[0] for r in ranks), penalty)
    for k, g in enumerate(grads):
        close(sum(r[1][k] for r in ranks), g)


# -- CUDA (skipped without it) ------------------------------------------------------------------------------------
def _cuda_devices():
    return [f"cuda:{i % torch.cuda.device_count()}" for i in range(3)]


@pytest.mark.gpu
def test_cuda_replicas_match_full_batch_batchnorm():
    torch.manual_seed(8)
    plain = _net().cuda()
    sync = convert_sync_batchnorm(copy.deepcopy(plain))
    x = torch.randn(7, 3, 4, 4, dtype=torch.float64, device="cuda")
    x_plain, x_sync = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_plain = plain(x_plain)
    outputs = DataParallelModel(sync, _cuda_devices())(x_sync)
    close(torch.cat([o.to("cuda:0") for o in outputs]), out_plain)
    out_plain.square().sum().backward()
    sum(o.square().sum().to("cuda:0") for o in outputs).backward()
    close(x_sync.grad, x_plain.grad)
    for p, q in zip(plain.parameters(), sync.parameters()):
        close(q.grad, p.grad)
    for key, value in _bn_state(plain).items():
        close(sync.state_dict()[key], value)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_replicas(dtype):
    torch.manual_seed(9)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), SyncBatchNorm(8), nn.ReLU()).cuda()
    x = torch.randn(7, 3, 8, 8, device="cuda") * 4 + 10
    reference = torch.cat(list(DataParallelModel(copy.deepcopy(net), _cuda_devices())(x)))
    with torch.autocast("cuda", dtype=dtype):
        outputs = DataParallelModel(net, _cuda_devices())(x)
    assert all(o.dtype == dtype for o in outputs)
    close(torch.cat([o.float().to("cuda:0") for o in outputs]), reference, atol=0.05)
    sum(o.float().sum().to("cuda:0") for o in outputs).backward()
    assert all(torch.isfinite(p.grad).all() for p in net.parameters())
