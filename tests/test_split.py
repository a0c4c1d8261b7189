"""Per-device split sizes (``chunk_sizes``): skewed and empty shares stay exact (float64, CPU replicas)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from encoding.nn import SegmentationLosses, convert_sync_batchnorm
from encoding.parallel import DataParallelCriterion, DataParallelModel
from equivalence import assert_same_sgd_step

CPU3 = ["cpu"] * 3


def close(got, want):
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def _net(nclass=5):
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.Conv2d(6, 6, 3, padding=1, bias=False), nn.BatchNorm2d(6, momentum=None), nn.ReLU(),
                         nn.Conv2d(6, nclass, 1)).double()


def _batch(n, seed, nclass=5, size=6):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g, dtype=torch.float64) * 2 + 1
    y = torch.randint(0, nclass, (n, size, size), generator=g)
    y[torch.rand(n, size, size, generator=g) < torch.linspace(0.0, 0.6, n).view(n, 1, 1)] = -1  # uneven ignore
    return x, y


def _bn_state(net):
    return {k: v for k, v in net.state_dict().items() if "running" in k or "num_batches" in k}


@pytest.mark.parametrize("chunk_sizes", [[1, 3, 3], [5, 1, 1], [0, 4, 3], [3, 0, 4], [0, 0, 7]],
                         ids=["1-3-3", "5-1-1", "device0-empty", "middle-empty", "one-device-not-source"])
def test_skewed_split_matches_plain_training_with_sync_batchnorm(chunk_sizes):
    """Loss, input and parameter gradients, and BatchNorm statistics over 3 SGD steps equal the whole batch's
    (``device0-empty``: the source device sits out, as on GPUs; its copy is dropped and the first running
    replica's buffers are copied back)."""
    torch.manual_seed(0)
    plain = _net()
    sync = convert_sync_batchnorm(copy.deepcopy(plain))
    model = DataParallelModel(sync, CPU3, chunk_sizes=chunk_sizes)
    criterion = DataParallelCriterion(SegmentationLosses(nclass=5), CPU3)
    reference = SegmentationLosses(nclass=5)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_sync = torch.optim.SGD(sync.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, y = _batch(7, step)

        def parallel_loss(x_sync):
            outputs = model(x_sync)
            assert outputs.split_sizes == [n for n in chunk_sizes if n]
            assert [o.shape[0] for o in outputs] == outputs.split_sizes
            assert outputs.devices == [torch.device("cpu")] * len(outputs.split_sizes)
            return criterion(outputs, y)
        assert_same_sgd_step(plain, sync, x, lambda x_plain: reference(plain(x_plain), y), parallel_loss,
                             (opt_plain, opt_sync), close)
    for key, value in _bn_state(plain).items():
        close(sync.state_dict()[key], value)


def test_skewed_split_cross_entropy_loss_is_exact_where_the_unweighted_mean_is_not():
    torch.manual_seed(1)
    net = _net().eval()  # plain BatchNorm: running statistics, so only the loss reduction is under test
    x, y = _batch(7, 3)
    model = DataParallelModel(net, CPU3, chunk_sizes=[1, 3, 3])
    outputs = model(x)
    loss = DataParallelCriterion(nn.CrossEntropyLoss(ignore_index=-1), CPU3)(outputs, y)
    reference = F.cross_entropy(net(x), y, ignore_index=-1)
    close(loss, reference)
    parts = torch.split(y, [1, 3, 3])
    unweighted = sum(F.cross_entropy(o, t, ignore_index=-1) for o, t in zip(outputs, parts)) / 3
    assert abs(unweighted.item() - reference.item()) > 1e-4  # far outside the 1e-6 tolerance


def test_chunk_sizes_attribute_can_change_between_calls():
    model = DataParallelModel(nn.Linear(4, 2), CPU3)
    assert model(torch.randn(7, 4)).split_sizes == [3, 2, 2]
    model.chunk_sizes = [2, 2, 6]
    assert model(torch.randn(10, 4)).split_sizes == [2, 2, 6]
    model.chunk_sizes = None
    assert model(torch.randn(10, 4)).split_sizes == [4, 3, 3]


@pytest.mark.parametrize("sizes,message", [
    ([1, 2], "one entry per device"),
    ([1, -1, 2], "non-negative integers"),
    ([1.5, 1, 1], "non-negative integers"),
    ([0, 0, 0], "no device a sample"),
])
def test_bad_chunk_sizes_are_named(sizes, message):
    with pytest.raises(ValueError, match=message):
        DataParallelModel(nn.Linear(4, 2), CPU3, chunk_sizes=sizes)


def test_chunk_sizes_must_sum_to_the_batch():
    model = DataParallelModel(nn.Linear(4, 2), CPU3, chunk_sizes=[1, 2, 3])
    with pytest.raises(ValueError, match=r"sum to 6 but the batch has 7"):
        model(torch.randn(7, 4))


def test_bad_balance_value_is_named():
    with pytest.raises(ValueError, match="balance must be None, 'memory'"):
        DataParallelModel(nn.Linear(4, 2), CPU3, balance="speed")


def test_balance_names_come_from_the_planner_registry(monkeypatch):
    """``encoding.parallel`` does not import the memory planner: ``balance="memory"`` is the name that
    ``encoding.memory`` registers; without it the error says what to import, and any planner can register."""
    from encoding.memory import MemoryBalancer
    from encoding.parallel import planners

    assert isinstance(DataParallelModel(nn.Linear(4, 2), CPU3, balance="memory").balance, MemoryBalancer)
    monkeypatch.setattr(planners, "_BALANCERS", {})
    with pytest.raises(ValueError, match="needs the memory planner.*encoding.memory"):
        DataParallelModel(nn.Linear(4, 2), CPU3, balance="memory")

    class AllOnDeviceZero:
        def plan(self, module, inputs, kwargs, device_ids, dim=0):
            return [inputs[0].shape[dim]] + [0] * (len(device_ids) - 1)

    planners.register_balancer("device0", AllOnDeviceZero)
    assert planners.registered_balancers() == ["device0"]
    assert DataParallelModel(nn.Linear(4, 2), CPU3, balance="device0")(torch.randn(5, 4)).split_sizes == [5]


# ------------------------------------------------------------------------------------------------ balance="memory"
@pytest.mark.parametrize("mode", ["eval-no-grad", "train-no-grad", "eval-inference-mode", "eval-with-grad"])
def test_memory_balance_evaluates_any_batch_forward_only_with_the_even_split(mode):
    """Evaluation and inference batches (issue 23, item 2) are forward only: the memory planner gives them the
    even split without simulating a training step, for any batch size (a last partial batch, fewer samples than
    devices), and the outputs are the plain module's (float64)."""
    torch.manual_seed(0)
    net = _net().train(mode.startswith("train"))
    model = DataParallelModel(net, ["cpu", "cpu"], balance="memory")
    context = {"eval-no-grad": torch.no_grad, "train-no-grad": torch.no_grad,
               "eval-inference-mode": torch.inference_mode, "eval-with-grad": torch.enable_grad}[mode]
    for n in (4, 3, 1):
        x, _ = _batch(n, n)
        with context():
            outputs = model(x)
            want = net.eval()(x) if not net.training else None
        assert outputs.split_sizes == {4: [2, 2], 3: [2, 1], 1: [1]}[n]
        if want is not None:
            close(torch.cat(list(outputs)), want)
    assert model.balance._plans == {}  # nothing was simulated for these batches


def test_memory_balance_still_plans_training_batches_after_evaluation():
    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(), nn.Conv2d(6, 5, 1)).double()
    model = DataParallelModel(net, ["cpu", "cpu"], balance="memory")
    with torch.no_grad():
        assert model(_batch(5, 0)[0]).split_sizes == [3, 2]
    outputs = model(_batch(5, 0)[0])  # training: simulated, cached under this batch's size
    assert sum(outputs.split_sizes) == 5 and len(model.balance._plans) == 1


def test_train_script_with_memory_balance_runs_through_evaluation(tmp_path, shapes_root):
    """``train.py --device-ids cpu,cpu --balance memory`` (docs/memory.md recommends it) trains and evaluates every
    validation image, the last partial batch (5 images, batch 4) included."""
    from conftest import TINY, load_script, tiny_shapes_pair

    train_set, val_set = tiny_shapes_pair(shapes_root, num_val=5)
    torch.manual_seed(0)
    result = load_script("train").main(TINY + ["--output-dir", str(tmp_path), "--device-ids", "cpu,cpu",
                                               "--balance", "memory"], datasets=(train_set, val_set))
    valid = sum(int((val_set[i][1] >= 0).sum()) for i in range(len(val_set)))
    assert int(result["confusion"].sum()) == valid > 0
