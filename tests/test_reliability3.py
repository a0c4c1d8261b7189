"""Reliability, round 3 (issue 35): the newer features under hostile input, full disks and changing clusters.

Each test failed before its fix: export over its own input / atomic export / dynamic ONNX of the pyramid pooling,
slide inference's uncovered pixels and memory, bounded configuration files, checkpoint options checked against the
stored shapes before building, one-line errors of the memory tool, and the enumeration of the project's file
writers (every one atomic).
"""
import errno
import json
import os

import numpy as np
import pytest
import torch

from encoding.engine.loading import ModelInfo
from encoding.export.cli import cli as export_cli
from encoding.models import get_segmentation_model
from encoding.utils.checkpoint import save_checkpoint


def _network(name="psp", **extra):
    return dict(dataset="shapes", model=name, backbone="vgg_tiny", output_stride=16, crop_size=32, base_size=40,
                **extra)


def _checkpoint(path, name="psp", **extra):
    """A train.py-style checkpoint of a small ``name`` network (random weights) at ``path``."""
    options = _network(name, **extra)
    torch.manual_seed(0)
    model = get_segmentation_model(name, dataset="shapes", backbone="vgg_tiny", output_stride=16,
                                   **({"channels": extra["head_channels"]} if extra.get("head_channels") else {}))
    save_checkpoint({"model": model, "epoch": 0, "args": options}, str(path))
    return str(path)


# ------------------------------------------------------------------------------------------- 1, 2: export files
def test_export_refuses_to_overwrite_its_own_checkpoint(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model_best.pth", "fcn")
    before = open(ckpt, "rb").read()
    with pytest.raises(SystemExit) as stop:
        export_cli(["--resume", ckpt, "--format", "exported", "--output", ckpt])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "model_best.pth" in err and "input" in err
    assert open(ckpt, "rb").read() == before
    # --output net.json: the model and its metadata would be one file
    with pytest.raises(SystemExit) as stop:
        export_cli(["--resume", ckpt, "--format", "onnx", "--output", str(tmp_path / "net.json")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "net.json" in err
    assert not (tmp_path / "net.json").exists()


def test_export_is_atomic_on_a_full_disk(tmp_path, monkeypatch, capsys):
    ckpt = _checkpoint(tmp_path / "model_best.pth", "fcn")
    output = tmp_path / "model.pt2"
    assert export_cli(["--resume", ckpt, "--format", "exported", "--output", str(output)]) == 0
    good = output.read_bytes()
    capsys.readouterr()
    real_save = torch.export.save

    def full_disk(program, f, *args, **kwargs):
        with open(f, "wb") as out:
            out.write(b"half a program")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.export, "save", full_disk)
    assert export_cli(["--resume", ckpt, "--format", "exported", "--output", str(output)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left" in err and "model.pt2" in err
    assert output.read_bytes() == good  # the earlier export is intact, and no temporary file is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.pt2", "model_best.pth"]
    monkeypatch.setattr(torch.export, "save", real_save)
