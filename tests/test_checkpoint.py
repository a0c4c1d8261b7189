"""save_checkpoint / load_checkpoint: round trip, atomicity, and clear refusals."""
import argparse
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from encoding.models import get_backbone
from encoding.utils.lr_scheduler import IterationLR
from encoding.utils import (BEST_NAME, CHECKPOINT_FORMAT, CheckpointError, load_checkpoint,
                            load_model_state, read_state_dict, save_checkpoint, unwrap_model)


class Net(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3)
        self.bn = nn.BatchNorm2d(width)
        self.head = nn.Conv2d(width, 2, 1)


class Wrapper(nn.Module):  # stands in for DataParallelModel / DDP: anything with a .module
    def __init__(self, module):
        super().__init__()
        self.module = module


def trained_state(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = IterationLR(opt, "poly", 0.1, 2, 3)
    loss = model.head(model.bn(model.conv(torch.randn(2, 3, 5, 5)))).sum()
    loss.backward()
    opt.step()
    sched.step()
    args = argparse.Namespace(lr=0.1, model="fcn", crop=(480, 480), out=Path(tmp_path), device=torch.device("cpu"))
    return model, opt, sched, args


def test_round_trip_unwraps_and_restores_everything(tmp_path):
    model, opt, sched, args = trained_state(tmp_path)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    metrics = {"pixAcc": np.float64(0.9), "IoU": np.array([0.5, np.nan]), "confusion": torch.eye(2)}
    written = save_checkpoint({"model": nn.DataParallel(Wrapper(model)), "optimizer": opt, "scheduler": sched,
                               "scaler": scaler, "epoch": 3, "best_pred": 0.75, "args": args, "metrics": metrics},
                              tmp_path / "run", is_best=True)
    assert written == os.path.join(tmp_path, "run", "checkpoint.pth")
    raw = torch.load(written, weights_only=True)  # plain weights_only loading works
    assert raw["format"] == CHECKPOINT_FORMAT and all(not k.startswith("module.") for k in raw["model"])
    assert raw["model"]._metadata["bn"]["version"] == 2  # module versions kept for load_state_dict
    assert raw["args"] == {"lr": 0.1, "model": "fcn", "crop": (480, 480), "out": str(tmp_path), "device": "cpu"}

    fresh = Net()
    opt2 = torch.optim.SGD(fresh.parameters(), lr=0.5, momentum=0.9)
    sched2 = IterationLR(opt2, "cos", 1.0, 5, 5)
    scaler2 = torch.amp.GradScaler("cpu")
    ckpt = load_checkpoint(written, "cpu", model=Wrapper(fresh), optimizer=opt2, scheduler=sched2, scaler=scaler2)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a.cpu(), b), k  # (nn.DataParallel moved `model` to cuda:0 where a GPU exists)
    assert ckpt["epoch"] == 3 and ckpt["best_pred"] == 0.75
    assert ckpt["metrics"]["pixAcc"] == 0.9 and torch.isnan(ckpt["metrics"]["IoU"][1])
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert all(torch.equal(s1[i]["momentum_buffer"].cpu(), s2[i]["momentum_buffer"]) for i in s1)
    assert sched2.state_dict() == sched.state_dict() and scaler2.get_scale() == 1024.0
    best = tmp_path / "run" / BEST_NAME
    assert best.read_bytes() == Path(written).read_bytes()


def test_destination_rules(tmp_path):
    model = Net()
    assert save_checkpoint({"model": model}, tmp_path / "a" / "epoch_3.pth") == str(tmp_path / "a" / "epoch_3.pth")
    assert save_checkpoint({"model": model}, tmp_path / "b", filename="x.pth") == str(tmp_path / "b" / "x.pth")
    (tmp_path / "v1.2").mkdir()
    assert save_checkpoint({"model": model}, tmp_path / "v1.2") == str(tmp_path / "v1.2" / "checkpoint.pth")
    assert not (tmp_path / "b" / BEST_NAME).exists()
    with pytest.raises(KeyError, match="'model'"):
        save_checkpoint({"epoch": 1}, tmp_path)
    with pytest.raises(TypeError, match="'args'.*function"):
        save_checkpoint({"model": model, "args": {"fn": lambda x: x}}, tmp_path)


def test_failed_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    model = Net()
    path = save_checkpoint({"model": model, "epoch": 1}, tmp_path)
    before = Path(path).read_bytes()
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (replaced.append((src, dst)), real_replace(src, dst)))
    save_checkpoint({"model": model, "epoch": 2}, tmp_path)
    (src, dst), = replaced
    assert os.path.dirname(src) == str(tmp_path) and dst == path  # temp file in the same directory, then rename
    assert load_checkpoint(path)["epoch"] == 2
    before = Path(path).read_bytes()

    def crash(fd):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint({"model": model, "epoch": 3}, tmp_path)
    assert Path(path).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pth"]  # no temp file left behind


def test_truncated_file(tmp_path):
    path = save_checkpoint({"model": Net()}, tmp_path)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pth")


class Payload:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_pickle_is_refused_and_does_not_run(tmp_path):
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(Payload(probe)))  # the payload is real: plain unpickling runs it
    assert probe.exists()

    marker = tmp_path / "pwned"
    raw = tmp_path / "raw.pth"
    raw.write_bytes(pickle.dumps({"format": CHECKPOINT_FORMAT, "version": 1, "model": Payload(marker)}, protocol=2))
    zipped = tmp_path / "zipped.pth"
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1, "model": {}, "args": Payload(marker)}, zipped)
    for path in (raw, zipped):
        with pytest.raises(CheckpointError, match="refused"):
            load_checkpoint(path)
    assert not marker.exists()


def test_foreign_files(tmp_path):
    model = Net()
    plain = tmp_path / "plain.pth"
    torch.save(model.state_dict(), plain)
    with pytest.raises(CheckpointError, match="not an encoding checkpoint.*allow_foreign"):
        load_checkpoint(plain)
    fresh = Net()
    assert set(load_checkpoint(plain, model=fresh, allow_foreign=True)) == {"model"}
    assert torch.equal(fresh.conv.weight, model.conv.weight)

    pe = tmp_path / "pe.pth.tar"  # PyTorch-Encoding layout, saved from a DataParallel model
    torch.save({"epoch": 7, "best_pred": 0.4,
                "state_dict": {"module." + k: v for k, v in model.state_dict().items()}}, pe)
    fresh = Net()
    ckpt = load_checkpoint(pe, model=fresh, allow_foreign=True)
    assert ckpt["epoch"] == 7 and torch.equal(fresh.head.weight, model.head.weight)

    other = tmp_path / "other.pth"
    torch.save([1, 2, 3], other)
    with pytest.raises(CheckpointError, match="neither"):
        load_checkpoint(other, allow_foreign=True)
    newer = tmp_path / "newer.pth"
    torch.save({"format": CHECKPOINT_FORMAT, "version": 99, "model": {}}, newer)
    with pytest.raises(CheckpointError, match="version 99"):
        load_checkpoint(newer)


def test_model_mismatch_lists_keys(tmp_path):
    path = save_checkpoint({"model": Net()}, tmp_path)

    class Other(Net):
        def __init__(self):
            super().__init__()
            self.extra = nn.Linear(2, 2)
            del self.head

    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, model=Other())
    message = str(info.value)
    assert "missing keys (2): extra.bias, extra.weight" in message
    assert "unexpected keys (2): head.bias, head.weight" in message
    with pytest.raises(CheckpointError, match=r"shape mismatch .*conv.weight: checkpoint \(4, 3, 3, 3\) vs model"):
        load_checkpoint(path, model=Net(width=8))
    partial = Other()
    skipped = load_model_state(partial, load_checkpoint(path)["model"], strict=False)
    assert sorted(skipped) == ["extra.bias", "extra.weight", "head.bias", "head.weight"]
    with pytest.raises(CheckpointError, match="no 'optimizer' state"):
        load_checkpoint(path, optimizer=torch.optim.SGD(Net().parameters(), lr=0.1))


def test_unwrap_model():
    inner = Net()
    assert unwrap_model(nn.DataParallel(Wrapper(inner))) is inner
    assert unwrap_model(inner) is inner


def test_read_state_dict_is_the_one_safe_reader(tmp_path):
    model = Net()
    for layout in ({"model": model.state_dict()}, {"state_dict": model.state_dict()}, model.state_dict()):
        torch.save(layout, tmp_path / "w.pth")
        state = read_state_dict(tmp_path / "w.pth")
        assert torch.equal(state["conv.weight"], model.conv.weight)
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pth"
    torch.save({"state_dict": Payload(marker)}, evil)
    with pytest.raises(CheckpointError, match="refused"):
        read_state_dict(evil)
    with pytest.raises(ValueError, match="refused"):  # what the model builders raise for pretrained=<bad file>
        get_backbone("resnet18", pretrained=evil)
    assert not marker.exists()
    with pytest.raises(FileNotFoundError, match="nothing.pth"):
        read_state_dict(tmp_path / "nothing.pth")


def test_pytorch_encodings_save_checkpoint_call_writes_where_its_scripts_read(tmp_path, monkeypatch):
    """PE's train.py: ``save_checkpoint({"epoch", "state_dict", "optimizer", "best_pred"}, args, is_best)`` writes
    ``runs/<dataset>/<model>/<backbone>/<checkname>/checkpoint.pth.tar`` and ``model_best.pth.tar``; PE's code reads
    ``state_dict`` back, ours ``model`` (it raised on the Namespace, then on the missing ``model``)."""
    monkeypatch.chdir(tmp_path)
    net = torch.nn.Linear(3, 2)
    args = argparse.Namespace(dataset="pascal_voc", model="encnet", backbone="resnet50", checkname="default")
    state = {"epoch": 1, "state_dict": net.state_dict(), "optimizer": torch.optim.SGD(net.parameters(), 0.1)
             .state_dict(), "best_pred": 0.5}
    path = save_checkpoint(state, args, True)
    folder = tmp_path / "runs" / "pascal_voc" / "encnet" / "resnet50" / "default"
    assert path == os.path.join("runs", "pascal_voc", "encnet", "resnet50", "default", "checkpoint.pth.tar")
    assert sorted(os.listdir(folder)) == ["checkpoint.pth.tar", "model_best.pth.tar"]
    for name in ("checkpoint.pth.tar", "model_best.pth.tar"):
        data = torch.load(folder / name, weights_only=True)
        assert data["epoch"] == 1 and all(torch.equal(data["state_dict"][k], v) for k, v in net.state_dict().items())
        assert load_checkpoint(str(folder / name))["model"].keys() == net.state_dict().keys()
    del args.backbone
    assert save_checkpoint(state, args, False).startswith(os.path.join("runs", "pascal_voc", "encnet", "default"))
