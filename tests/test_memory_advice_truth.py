"""The memory tool's answers checked against its own simulator: the advice at a batch the devices do not divide and
with the kernels' buffers, the optimizers that read a scalar (Adam), the optimizer ``balance="memory"`` plans
for, and the files the tool refuses to write over."""
import dataclasses
import json
import os
import sys

import pytest
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(__file__))
from folder_data import make_folder  # noqa: E402
from test_memory_plan import NCLASS, ShardNet, shard_spec  # noqa: E402

from encoding.memory import MemoryBalancer, Simulator, plan  # noqa: E402
from encoding.memory.advice import CROP_STEP  # noqa: E402
from encoding.memory.program import DeviceProgram  # noqa: E402
from encoding.memory.tracker import Workspaces  # noqa: E402
from encoding.nn import SegmentationLosses  # noqa: E402


def _criterion():
    return SegmentationLosses(aux=True, nclass=NCLASS)


def _plan(strategy="ddp", **options):
    return plan(ShardNet(), _criterion(), num_devices=options.pop("num_devices", 2), strategies=(strategy,),
                **options)


# ------------------------------------------------------------------------------------------------ uneven batches
@pytest.mark.parametrize("strategy", ["ddp", "gather", "zero1"])
def test_max_crop_of_an_uneven_batch_fits_its_real_split(strategy):
    """Batch 10 on 4 devices is split 3/3/2/2: the advised crop fits that split, one crop step more does not."""
    limit = max(_plan(strategy, crop=64, batch=8, num_devices=4).peaks[strategy]) + 4096  # 2 per device just fit
    row = _plan(strategy, crop=32, batch=10, num_devices=4, memory_limit=limit).advice[0]
    at = _plan(strategy, crop=row.max_crop, batch=10, num_devices=4)
    beyond = _plan(strategy, crop=row.max_crop + CROP_STEP, batch=10, num_devices=4)
    assert at.splits[strategy] == [3, 3, 2, 2]
    assert max(at.peaks[strategy]) <= limit < max(beyond.peaks[strategy])


# ------------------------------------------------------------------------------------------------ kernel buffers
def test_gloo_advice_recommends_a_batch_its_own_peaks_fit():
    """plan(backend="gloo") adds the CPU kernels' buffers to its peaks: its advice counts them too."""
    options = dict(crop=32, backend="gloo")
    limit = max(_plan(batch=10, crop=32).peaks["ddp"])  # 5 per device without the kernels' buffers
    best = _plan(batch=10, memory_limit=limit, **options).recommended
    assert best is not None and best.max_batch > 0
    assert _plan(batch=best.max_batch, memory_limit=limit, **options).fits(strategy="ddp")
    assert not _plan(batch=best.max_batch + 2, memory_limit=limit, **options).fits(strategy="ddp")


class _ConvolutionBuffer(Workspaces):
    """A workspace of a fixed size in every convolution, forward and backward (what ``workspaces=`` adds)."""

    def __init__(self, nbytes):
        super().__init__({})
        self.nbytes = nbytes

    def bytes(self, name, shapes, *shares):
        return self.nbytes if name.startswith("aten::convolution") else 0


def test_advice_counts_the_workspaces_given_to_plan():
    buffers = _ConvolutionBuffer(2 ** 20)
    limit = max(_plan(batch=4, crop=32, workspaces=buffers).peaks["ddp"]) + 4096  # 2 per device with the buffers
    best = _plan(batch=4, crop=32, memory_limit=limit, workspaces=buffers).recommended
    assert best is not None and best.max_batch > 0
    assert _plan(batch=best.max_batch, crop=32, memory_limit=limit, workspaces=buffers).fits(strategy="ddp")
    assert not _plan(batch=best.max_batch + 2, crop=32, memory_limit=limit, workspaces=buffers).fits(strategy="ddp")


def test_gloo_probe_keeps_a_weight_whose_rows_equal_the_share():
    """A convolution of NCLASS output channels on NCLASS samples per device: only the batch is resized in a probe."""
    gloo = _plan(crop=16, batch=2 * NCLASS, backend="gloo").peaks["ddp"]
    assert min(gloo) >= max(_plan(crop=16, batch=2 * NCLASS).peaks["ddp"])


# ------------------------------------------------------------------------------------------------ Adam
def _start_level(optimizer):
    sim = Simulator(dataclasses.replace(shard_spec(), optimizer=optimizer), 1)
    return sim.result(DeviceProgram("ddp", 2, 2, False, 2, 0)).phases[0]


def test_adamw_is_simulated_and_holds_one_parameter_sized_buffer_more_than_sgd_momentum():
    params = list(ShardNet().parameters())
    parameter_bytes = sum(p.numel() * p.element_size() for p in params)
    step_bytes = len(params) * torch.tensor(0.0).element_size()  # Adam's step: one float scalar per parameter
    sgd = _start_level(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    adamw = _start_level(lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    assert adamw - sgd == parameter_bytes + step_bytes
    planned = _plan(crop=32, batch=4, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=True))
    assert min(planned.peaks["ddp"]) > adamw


# ------------------------------------------------------------------------------------------------ wrap_model
def _balanced_split(balancer, net, x):
    return balancer.plan(net, (x,), {}, [torch.device("cpu")] * 3)


def test_wrap_model_plans_the_memory_split_for_the_run_s_optimizer():
    from encoding.engine import builders

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 128, 1), *[nn.Conv2d(128, 128, 1) for _ in range(6)], nn.Conv2d(128, 5, 1))
    x, criterion = torch.randn(12, 3, 8, 8), nn.CrossEntropyLoss()
    placement = builders.select_devices(["cpu"] * 3)
    for options, reference in [
            ({"kind": "adamw", "weight_decay": 1e-4}, lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=1e-4)),
            ({"kind": "sgd", "momentum": 0.0}, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.0,
                                                                          weight_decay=1e-4))]:
        wrapped, _ = builders.wrap_model(net, criterion, placement, balance="memory", optimizer=options)
        expected = _balanced_split(MemoryBalancer(criterion, optimizer=reference), net, x)
        assert _balanced_split(wrapped.balance, net, x) == expected
    adamw = _balanced_split(MemoryBalancer(criterion, optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3)), net, x)
    assert adamw != _balanced_split(MemoryBalancer(criterion), net, x)  # the optimizer changes the split here
    with pytest.raises(ValueError, match="unknown option.*lr"):
        builders.wrap_model(net, criterion, placement, balance="memory", optimizer={"lr": 0.1})


# ------------------------------------------------------------------------------------------------ the tool's files
@pytest.fixture
def no_work(monkeypatch):
    from encoding.memory import cli

    monkeypatch.setattr(cli, "memory_report", lambda *a, **k: pytest.fail("work started"))
    return cli


def _refused(cli, argv, capsys):
    status = cli.cli(argv + ["--simulate", "2", "--crop-size", "32"])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1, err
    return err


def test_memory_tool_refuses_to_write_over_the_dataset_s_class_file(tmp_path, no_work, capsys):
    root = str(tmp_path / "ds")
    make_folder(root, n_train=2, n_val=1)
    classes = os.path.join(root, "classes.json")
    with open(classes, "w") as f:
        json.dump({"classes": ["background", "a", "b"]}, f)
    before = open(classes).read()
    base = ["--dataset", "folder", "--data-root", root, "--out-dir", str(tmp_path / "out")]
    assert "--json" in _refused(no_work, base + ["--json", classes], capsys)
    mask = os.path.join(root, "masks", "img00.png")
    assert "--chart" in _refused(no_work, base + ["--chart", mask], capsys)
    assert open(classes).read() == before and os.path.getsize(mask) > 0


@pytest.mark.parametrize("name", ["timeline.json", "timeline.png", "timeline.html"])
def test_memory_tool_refuses_a_report_where_the_timeline_writes(name, tmp_path, no_work, capsys):
    folder = str(tmp_path / "tl")
    argv = ["--json", os.path.join(folder, name), "--timeline", folder, "--out-dir", str(tmp_path)]
    err = _refused(no_work, argv, capsys)
    assert "--timeline" in err and "--json" in err
