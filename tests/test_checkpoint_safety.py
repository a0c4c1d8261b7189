"""Checkpoint files hold only good states and never lose the best model: non-finite tensors are refused (the run
names the epoch, the iteration and the tensor), the best file is written before the checkpoint and rederived when
missing, foreign or unsafe files and a full disk get one-line messages naming the file, and the files' permissions
follow the umask (issues 12 and 24).
"""
import errno
import os

import pytest
import torch
from conftest import TINY
from torch import nn
from training_runs import load_train_script, run_dir_of, train_tiny

from encoding.engine.state import restore_best
from encoding.utils import CheckpointError, load_checkpoint, read_state_dict, save_checkpoint
from encoding.utils.checkpoint import BEST_NAME, CHECKPOINT_NAME, NonFiniteError
from encoding.utils.files import atomic_write


# -- non-finite states are never saved ---------------------------------------------------------------------------------
def test_diverged_state_is_not_saved_and_the_run_names_epoch_and_tensor(tiny_shapes, tmp_path, capsys):
    script = load_train_script()
    out = str(tmp_path / "runs")
    status = script.cli(TINY[:-2] + ["--epochs", "6", "--lr", "1e6", "--train-limit", "4", "--no-val",
                                     "--output-dir", out], datasets=tiny_shapes)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 1 and "training diverged in epoch" in err and "(" in err, err
    path = os.path.join(run_dir_of(out), CHECKPOINT_NAME)
    if os.path.exists(path):  # an earlier, still finite epoch: kept as it was
        assert "last good checkpoint" in err
        model = load_checkpoint(path)["model"]
        assert all(torch.isfinite(t).all() for t in model.values() if t.is_floating_point())


def test_a_diverged_state_names_epoch_iteration_and_tensor(tiny_shapes, tmp_path, monkeypatch, capsys):
    from encoding.engine import hooks

    def diverged(state, *args, **kwargs):
        raise NonFiniteError("non-finite", "model.head.weight (3 of 9 values NaN/inf)")

    monkeypatch.setattr(hooks, "save_checkpoint", diverged)
    status, _ = train_tiny(tiny_shapes, tmp_path, "--train-limit", "8", "--no-val")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 1 and "epoch 0 by iteration 2" in err and "model.head.weight" in err, err


def test_save_checkpoint_refuses_nan_or_inf_and_keeps_the_good_file(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    path = save_checkpoint({"model": model, "epoch": 0}, tmp_path)
    good = open(path, "rb").read()
    model[1].running_var.fill_(float("inf"))
    with pytest.raises(NonFiniteError, match=r"model\.1\.running_var \(4 of 4 values NaN/inf\)") as info:
        save_checkpoint({"model": model, "epoch": 1}, tmp_path, is_best=True)
    assert info.value.tensor == "model.1.running_var (4 of 4 values NaN/inf)"
    assert open(path, "rb").read() == good and not os.path.exists(tmp_path / BEST_NAME)


# -- the best model is never lost --------------------------------------------------------------------------------------
def test_best_file_is_written_before_the_checkpoint(tmp_path, monkeypatch):
    import encoding.utils.checkpoint as ckpt
    model = nn.Linear(2, 2)
    save_checkpoint({"model": model, "epoch": 0, "best_pred": 0.1, "best_epoch": 0}, tmp_path, is_best=True)
    written = []

    def killed_after_first_write(path, data):
        if written:
            raise KeyboardInterrupt  # the run dies between the two writes
        written.append(path)
        return atomic_write(path, data)

    monkeypatch.setattr(ckpt, "atomic_write", killed_after_first_write)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"model": model, "epoch": 1, "best_pred": 0.5, "best_epoch": 1}, tmp_path, is_best=True)
    assert load_checkpoint(tmp_path / BEST_NAME)["best_pred"] == 0.5  # the new best survived
    assert load_checkpoint(tmp_path / CHECKPOINT_NAME)["epoch"] == 0  # resume redoes epoch 1


def test_missing_best_file_is_rederived_from_the_checkpoint(tmp_path):
    model = nn.Linear(2, 2)
    save_checkpoint({"model": model, "epoch": 3, "best_pred": 0.4, "best_epoch": 3}, tmp_path)
    assert restore_best(tmp_path) == os.path.join(tmp_path, BEST_NAME)
    assert load_checkpoint(tmp_path / BEST_NAME)["epoch"] == 3
    assert restore_best(tmp_path) is None  # consistent now
    save_checkpoint({"model": model, "epoch": 4, "best_pred": 0.4, "best_epoch": 3}, tmp_path)
    assert restore_best(tmp_path) is None  # the best is an older epoch: its file is kept


# -- foreign files, full disks, permissions ----------------------------------------------------------------------------
def test_foreign_and_unsafe_files_get_our_messages(tmp_path):
    jpeg = tmp_path / "photo.jpg"
    jpeg.write_bytes(b"\xff\xd8\xff\xe0" + bytes(200))
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        load_checkpoint(jpeg)
    unsafe = tmp_path / "weights.pth"
    torch.save({"model": os.getcwd}, unsafe)
    with pytest.raises(CheckpointError) as info:
        read_state_dict(unsafe)
    assert "could run arbitrary code" in str(info.value) and "weights_only" not in str(info.value)


def test_disk_full_names_the_file(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    target = str(tmp_path / CHECKPOINT_NAME)
    with pytest.raises(OSError, match=f"cannot write {target}: No space left on device"):
        save_checkpoint({"model": nn.Linear(1, 1)}, target)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_checkpoint_permissions_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = save_checkpoint({"model": nn.Linear(1, 1)}, tmp_path, is_best=True)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == mode and os.stat(tmp_path / BEST_NAME).st_mode & 0o777 == mode
