"""Training runs that never lose work (issue 12): validated options, safe checkpoints, exact resume, clean interrupts.

Tiny CPU runs of ``experiments/segmentation/train.py`` on an 8-train / 4-val generated ``shapes`` set handed to the
run (conftest.py's ``tiny_shapes_pair``); kills and signals use subprocesses (see ``_DRIVER``), everything else runs
in-process.
"""
import errno
import glob
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from conftest import ROOT, TINY, load_script, tiny_shapes_pair
from encoding.datasets import DatasetError, get_segmentation_dataset
from encoding.engine import GracefulInterrupt
from encoding.engine import state
from encoding.engine.state import restore_best
from encoding.utils import CheckpointError, EpochLogger, load_checkpoint, read_state_dict, save_checkpoint
from encoding.utils.checkpoint import BEST_NAME, CHECKPOINT_NAME, NonFiniteError
from encoding.utils.determinism import EpochSampler, SeededSamples, rng_state, set_rng_state
from encoding.utils.files import atomic_write, staged_dir
from encoding.utils.rundir import RunDirLock, RunDirLocked, remove_stale_temp_files

SMALL = dict(num_train=8, num_val=4, progress=False)
#: Runs train.py's command line in a subprocess on the small shapes set (``sys.argv[1:]`` are its options).
_DRIVER = ("import sys; sys.path[:0] = ['tests', 'experiments/segmentation']; from conftest import tiny_shapes_pair; "
           "import train; sys.exit(train.cli(sys.argv[1:], datasets=tiny_shapes_pair(num_train=32)))")
# FCN-ResNet18 (not the lighter default model) on 32 training scenes (8 iterations an epoch): an epoch lasts long
# enough for kills and signals to land inside training.
RUN = ["--model", "fcn", "--backbone", "resnet18", "--crop-size", "32", "--base-size", "40", "--batch-size", "4",
       "--workers", "0", "--deterministic", "--val-limit", "2"]
EPOCHS = 2


def load_train_script():
    return load_script("train")


def _run_dir(out, model="unet"):
    return os.path.join(out, "shapes", model, "default")


def _spawn(data, out, extra, **kwargs):
    env = {**os.environ, "ENCODING_DATA": str(data), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", _DRIVER, *RUN, "--output-dir", str(out), *extra], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _resume_args(run_dir):
    """``--resume`` the run's checkpoint when one was written (a kill may come before the first one)."""
    path = os.path.join(run_dir, CHECKPOINT_NAME)
    return ["--resume", path] if os.path.exists(path) else []


def _finished(run_dir):
    """Whether the run's checkpoint completed every epoch (nothing left to resume)."""
    path = os.path.join(run_dir, CHECKPOINT_NAME)
    return os.path.exists(path) and state.read(path).finished(EPOCHS)


def _wait_until_training(proc):
    """Block until the run printed its summary line (the model is built, training starts)."""
    line = proc.stdout.readline()
    assert "writing to" in line, line + proc.stderr.read()


def _weights(path):
    checkpoint = load_checkpoint(path, map_location="cpu")
    return checkpoint["model"], checkpoint["optimizer"]


def _assert_bitwise_equal(a, b):
    for (model_a, optim_a), (model_b, optim_b) in [(a, b)]:
        assert model_a.keys() == model_b.keys()
        for key in model_a:
            assert torch.equal(model_a[key], model_b[key]), key
        for (_, sa), (_, sb) in zip(sorted(optim_a["state"].items()), sorted(optim_b["state"].items())):
            assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted --deterministic run of EPOCHS epochs (subprocess): its data root, final weights, how long
    its training took and how long its first epoch took (seconds, from the epoch's summary line: what follows the
    last epoch, e.g. the curves plot, does not count)."""
    base = tmp_path_factory.mktemp("reference")
    proc = _spawn(base / "data", base / "runs", ["--epochs", str(EPOCHS)])
    _wait_until_training(proc)
    started = time.monotonic()
    first_epoch = None
    for line in proc.stdout:
        if line.startswith("epoch 0:"):
            first_epoch = time.monotonic() - started
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and first_epoch is not None, out + err
    return (base / "data", _weights(os.path.join(_run_dir(base / "runs", "fcn"), CHECKPOINT_NAME)),
            time.monotonic() - started, first_epoch)


# -- 1. non-finite state is never saved --------------------------------------------------------------------------
def test_diverged_state_is_not_saved_and_the_run_names_epoch_and_tensor(tiny_shapes, tmp_path, capsys):
    script = load_train_script()
    out = str(tmp_path / "runs")
    status = script.cli(TINY[:-2] + ["--epochs", "6", "--lr", "1e6", "--train-limit", "4", "--no-val",
                                     "--output-dir", out], datasets=tiny_shapes)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 1 and "training diverged in epoch" in err and "(" in err, err
    path = os.path.join(_run_dir(out), CHECKPOINT_NAME)
    if os.path.exists(path):  # an earlier, still finite epoch: kept as it was
        assert "last good checkpoint" in err
        model = load_checkpoint(path)["model"]
        assert all(torch.isfinite(t).all() for t in model.values() if t.is_floating_point())


def test_save_checkpoint_refuses_nan_or_inf_and_keeps_the_good_file(tmp_path):
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    path = save_checkpoint({"model": model, "epoch": 0}, tmp_path)
    good = open(path, "rb").read()
    model[1].running_var.fill_(float("inf"))
    with pytest.raises(NonFiniteError, match=r"model\.1\.running_var \(4 of 4 values NaN/inf\)") as info:
        save_checkpoint({"model": model, "epoch": 1}, tmp_path, is_best=True)
    assert info.value.tensor == "model.1.running_var (4 of 4 values NaN/inf)"
    assert open(path, "rb").read() == good and not os.path.exists(tmp_path / BEST_NAME)


# -- 2. the best model is never lost ------------------------------------------------------------------------------
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


# -- 3. one run per directory ----------------------------------------------------------------------------------
def test_run_directory_lock_refuses_a_second_run_and_takes_over_stale_locks(tmp_path):
    with RunDirLock(str(tmp_path / "run")) as lock:
        assert open(lock.path).read().split()[0] == str(os.getpid())
        with pytest.raises(RunDirLocked, match=f"in use by another run \\(pid {os.getpid()}"):
            RunDirLock(str(tmp_path / "run")).acquire()
    assert not os.path.exists(lock.path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with open(lock.path, "w") as f:
        f.write(f"{int(dead.stdout)} {os.uname().nodename}\n")
    with RunDirLock(str(tmp_path / "run")) as taken:
        assert taken.stale_owner == int(dead.stdout)


def test_second_training_run_into_a_locked_directory_is_refused_in_one_line(tiny_shapes, tmp_path, capsys):
    script = load_train_script()
    out = str(tmp_path / "runs")
    with RunDirLock(_run_dir(out)):
        started = time.monotonic()
        assert script.cli(TINY + ["--output-dir", out], datasets=tiny_shapes) == 1
        assert time.monotonic() - started < 5  # refused before building anything
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is in use by another run (pid" in err[0]
    assert not os.path.exists(os.path.join(_run_dir(out), "log.jsonl"))


# -- 4. exact resume after kill -9 ---------------------------------------------------------------------------------
def test_kill_9_at_random_points_then_resume_ends_bitwise_equal(reference, tmp_path):
    data, expected, duration, first_epoch = reference
    out = tmp_path / "runs"
    run_dir, rng = _run_dir(out, "fcn"), random.Random(12)
    for _ in range(2):
        if _finished(run_dir):  # a loaded machine: the run finished before the kill came; resume what is there
            break
        proc = _spawn(data, out, ["--epochs", str(EPOCHS)] + _resume_args(run_dir))
        _wait_until_training(proc)
        time.sleep(rng.uniform(0.2, 0.9) * duration)
        proc.kill()
        proc.communicate()
        for path in glob.glob(os.path.join(run_dir, "*.pth")):  # every file on disk loads
            load_checkpoint(path, map_location="cpu")
    proc = _spawn(data, out, ["--epochs", str(EPOCHS)] + _resume_args(run_dir))
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout + stderr
    assert _finished(run_dir)
    assert not glob.glob(os.path.join(run_dir, ".*.tmp")) and not os.path.exists(os.path.join(run_dir, ".lock"))
    _assert_bitwise_equal(_weights(os.path.join(run_dir, CHECKPOINT_NAME)), expected)
    epochs = [json.loads(line)["epoch"] for line in open(os.path.join(run_dir, "log.jsonl"))]
    assert epochs == list(range(EPOCHS))  # one row per epoch: no duplicate after resumes


def test_rng_state_round_trips_through_a_checkpoint(tmp_path):
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    save_checkpoint({"model": {}, "rng": rng_state()}, tmp_path)
    expected = torch.rand(3), np.random.rand(3), random.random()
    set_rng_state(load_checkpoint(tmp_path / CHECKPOINT_NAME)["rng"])
    again = torch.rand(3), np.random.rand(3), random.random()
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def test_epoch_order_and_sample_augmentation_depend_only_on_seed_epoch_and_sample():
    sampler = EpochSampler(range(10), seed=5)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2, start=4)
    assert list(sampler) == full[4:] and len(sampler) == 6
    sampler.set_epoch(3)
    assert list(sampler) != full and {e for e, _ in sampler} == {3}
    noisy = SeededSamples([None] * 10, seed=1)
    noisy.dataset = type("Noise", (), {"__getitem__": lambda self, i: torch.rand(2), "__len__": lambda self: 10})()
    before = torch.get_rng_state()
    first = noisy[(2, 7)]
    assert torch.equal(torch.get_rng_state(), before)  # the global RNG (dropout) is untouched
    assert torch.equal(noisy[(2, 7)], first) and not torch.equal(noisy[(3, 7)], first)


# -- 5. no error after the work is done ----------------------------------------------------------------------------
def test_unwritable_run_directory_fails_before_training(tiny_shapes, tmp_path, monkeypatch, capsys):
    import encoding.engine.config as config
    script = load_train_script()
    out = str(tmp_path / "runs")
    real_open = os.open

    def read_only(path, flags, *args):
        if os.fspath(path).startswith(out) and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    built = []
    monkeypatch.setattr(config, "build_training", lambda *args, **kwargs: built.append(args))
    assert script.cli(TINY + ["--output-dir", out], datasets=tiny_shapes) == 1
    err = capsys.readouterr().err.strip()
    assert "is not writable" in err and _run_dir(out) in err and not built


def _truncate_first_val_image(data):
    folder = os.path.join(data, "shapes-seed0-8-4", "JPEGImages")
    path = os.path.join(folder, "val_00000.jpg")
    payload = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(payload[:len(payload) // 3])
    return path


def test_failing_evaluation_keeps_the_trained_epoch_and_verify_data_finds_it_first(tmp_path, capsys):
    data = tmp_path / "data"  # a set of its own: one validation image is broken
    tiny_shapes_pair(data)
    bad = _truncate_first_val_image(data)
    script = load_train_script()
    out = str(tmp_path / "runs")
    # a bad file found by --verify-data before the run is the data refused (2); met during the run, it fails it (1)
    assert script.cli(TINY + ["--output-dir", out, "--verify-data"], datasets=tiny_shapes_pair(data)) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert bad in err and not os.path.exists(os.path.join(_run_dir(out), CHECKPOINT_NAME))
    assert script.cli(TINY + ["--output-dir", out], datasets=tiny_shapes_pair(data)) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "evaluation after epoch 0 failed" in err and bad in err
    assert load_checkpoint(os.path.join(_run_dir(out), CHECKPOINT_NAME))["epoch"] == 0
    assert script.cli(TINY + ["--output-dir", out, "--verify-data", "--skip-bad", "--overwrite"],
                      datasets=tiny_shapes_pair(data, skip_bad=True)) == 0
    captured = capsys.readouterr()
    assert "verify: dropped 1 bad sample(s) of 'val'" in captured.out


# -- 6. bad options: one line, exit 2, before any work -------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--eval"], "--eval evaluates a checkpoint: pass --resume"),
    (["--clip-grad", "-1"], "argument --clip-grad: must be > 0.0, got -1"),
    (["--clip-grad", "0"], "argument --clip-grad: must be > 0.0"),
    (["--lr", "0"], "argument --lr: must be > 0.0"),
    (["--lr", "nan"], "argument --lr: must be > 0.0"),
    (["--crop-size", "0"], "argument --crop-size: must be > 0, got 0"),
    (["--crop-size", "-5"], "argument --crop-size: must be > 0, got -5"),
    (["--train-limit", "0"], "argument --train-limit: must be > 0"),
    (["--base-size", "0"], "argument --base-size: must be > 0"),
    (["--start-epoch", "16", "--epochs", "16"], "--start-epoch 16 must be below --epochs 16"),
    (["--resume", "no/such.pth"], "argument --resume: no such file: no/such.pth"),
])
def test_bad_options_fail_in_one_line_with_status_2(argv, message, capsys):
    script = load_train_script()
    with pytest.raises(SystemExit) as info:
        script.parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and message in err[0], err


def test_crop_larger_than_base_warns_and_a_finished_run_says_so(tmp_path, capsys):
    script = load_train_script()
    script.parse_args(["--crop-size", "200", "--base-size", "100"])
    assert "--crop-size 200 is larger than --base-size 100" in capsys.readouterr().err
    path = save_checkpoint({"model": {}, "epoch": 4}, tmp_path)
    assert script.cli(["--epochs", "5", "--resume", path, "--output-dir", str(tmp_path)]) == 0
    assert "nothing to do" in capsys.readouterr().out


# -- 7. messages that point the right way ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pascal_voc", "pascal_aug", "ade20k", "citys", "pcontext"])
def test_missing_dataset_names_an_existing_prepare_script_and_data_root(name, tmp_path):
    with pytest.raises(DatasetError) as info:
        get_segmentation_dataset(name, root=str(tmp_path))
    script = str(info.value).split("run python ", 1)[1].split(",", 1)[0]
    assert os.path.isfile(os.path.join(ROOT, script)) and "--data-root" in str(info.value)


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


# -- 8. leftovers -------------------------------------------------------------------------------------------------------
def test_stale_temp_files_and_staging_folders_are_cleaned(tmp_path):
    stale = tmp_path / f".{CHECKPOINT_NAME}.{'ab' * 16}.tmp"
    stale.write_bytes(b"partial")
    keep = tmp_path / "notes.tmp"
    keep.write_text("mine")
    with RunDirLock(str(tmp_path)):
        assert remove_stale_temp_files(str(tmp_path)) == [str(stale)]
    assert keep.exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = tmp_path / f".shapes.tmp-{int(dead.stdout)}-x1"
    leftover.mkdir()
    alive = tmp_path / f".shapes.tmp-{os.getpid()}-x2"
    alive.mkdir()
    with staged_dir(str(tmp_path / "shapes")) as staging:
        assert os.path.basename(staging).startswith(f".shapes.tmp-{os.getpid()}-")
    assert not leftover.exists() and alive.exists()


def test_resumed_log_has_one_row_per_epoch(tmp_path):
    with EpochLogger(str(tmp_path)) as log:
        for epoch in range(4):
            log.write(epoch, loss=1.0 / (epoch + 1))
        log.resume_after(1)  # resuming a checkpoint of epoch 1: rows 2 and 3 will be written again
        assert [r["epoch"] for r in log.rows()] == [0, 1]
        log.resume_after(2, {"epoch": 2, "loss": 0.3})  # stopped between the checkpoint and its log row
        assert [r["epoch"] for r in log.rows()] == [0, 1, 2]
    assert [line.split(",")[0] for line in open(tmp_path / "log.csv")] == ["epoch", "0", "1", "2"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_checkpoint_permissions_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = save_checkpoint({"model": nn.Linear(1, 1)}, tmp_path, is_best=True)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == mode and os.stat(tmp_path / BEST_NAME).st_mode & 0o777 == mode


# -- 9. skip_bad counts survive DataLoader workers ------------------------------------------------------------------
def test_skip_bad_counts_samples_skipped_in_worker_processes(tmp_path):
    get_segmentation_dataset("shapes", root=str(tmp_path), split="val", **SMALL)
    _truncate_first_val_image(tmp_path)
    with pytest.warns(RuntimeWarning, match="skipping bad sample"):
        dataset = get_segmentation_dataset("shapes", root=str(tmp_path), split="val", skip_bad=True, **SMALL)
        dataset[0]
    assert dataset.num_skipped == 1
    dataset = get_segmentation_dataset("shapes", root=str(tmp_path), split="val", skip_bad=True, **SMALL)
    batches = list(DataLoader(dataset, batch_size=1, num_workers=2))
    assert len(batches) == 4 and dataset.num_skipped == 1
    assert pickle.loads(pickle.dumps(dataset)).num_skipped == 1


# -- 10. Ctrl-C ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_sigterm_and_sighup_save_a_mid_epoch_checkpoint_and_resume_continues_exactly(signum, reference,
                                                                                              tmp_path):
    data, expected, duration, first_epoch = reference
    out = tmp_path / "runs"
    checkpoint = os.path.join(_run_dir(out, "fcn"), CHECKPOINT_NAME)
    proc = _spawn(data, out, ["--epochs", str(EPOCHS)])
    _wait_until_training(proc)
    time.sleep(0.3 * first_epoch)  # inside the first epoch's training, whatever the run does after its last
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    last = stderr.strip().splitlines()[-1]
    by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"  # 130, 143, 129
    assert proc.returncode == 128 + signum and last.startswith(f"train.py: interrupted{by} "), stdout + stderr
    assert "Traceback" not in stderr and f"--resume {checkpoint}" in last
    assert not os.path.exists(os.path.join(_run_dir(out, "fcn"), ".lock"))  # released
    saved = load_checkpoint(checkpoint)
    assert saved["iteration"] > 0 or "while evaluating" in last
    if signum == signal.SIGHUP:
        return  # the same path as SIGTERM from here on
    proc = _spawn(data, out, ["--epochs", str(EPOCHS), "--resume", checkpoint])
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout + stderr
    _assert_bitwise_equal(_weights(checkpoint), expected)


def test_second_ctrl_c_exits_at_once(monkeypatch, capsys):
    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    monkeypatch.setattr(GracefulInterrupt, "DUPLICATE_S", 0.0)  # a repeat within it is the same request
    with GracefulInterrupt() as interrupt:
        signal.raise_signal(signal.SIGINT)
        assert interrupt.requested() and not exits
        signal.raise_signal(signal.SIGINT)
        assert exits == [130]
    assert "second SIGINT: exiting now" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- 11. round 2 (issue 24): kernel-held locks, signals, dying parents -----------------------------------------------
def _dead_pid():
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


_HOLD_RUN_DIR = ("import sys; from encoding.utils.rundir import RunDirLock; lock = RunDirLock(sys.argv[1]).acquire(); "
                 "open(lock.path, 'w').write(sys.argv[2]); print('held', flush=True); sys.stdin.read()")


def test_run_directory_lock_of_a_live_run_in_another_pid_namespace_is_not_taken(tmp_path):
    # a live run whose lock file names a pid that does not exist here (as seen from another PID namespace)
    run_dir = str(tmp_path / "run")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_RUN_DIR, run_dir, f"{_dead_pid()} {os.uname().nodename}"],
                              cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirLocked, match="in use by another run"):
            RunDirLock(run_dir).acquire()
    finally:
        holder.kill()  # kill -9: the kernel releases its lock
        holder.communicate()
    with RunDirLock(run_dir) as lock:
        assert open(lock.path).read().split()[0] == str(os.getpid())
    assert not os.path.exists(lock.path)


def test_sigterm_to_torchrun_saves_on_the_main_process_and_no_rank_hangs(reference, tmp_path):
    data = reference[0]
    out = tmp_path / "runs"
    run_dir = _run_dir(out, "fcn")
    env = {**os.environ, "ENCODING_DATA": str(data), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "--no-python", sys.executable, "-c", _DRIVER, *RUN, "--output-dir", str(out),
                             "--epochs", "20", "--batch-size", "1", "--no-cuda", "--dist-timeout", "60"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_training(proc)
    line = proc.stdout.readline()
    assert line.startswith("epoch 0:"), line
    time.sleep(1.0)  # into epoch 1
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)  # what a batch scheduler sends; torchrun forwards it to every rank
    stdout, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - started < 30 and proc.returncode != 0, stdout + stderr  # before torchrun's SIGKILL
    assert stderr.count("train.py: interrupted by SIGTERM") == 2 and "[rank" not in stderr, stderr  # no traceback
    saved = load_checkpoint(os.path.join(run_dir, CHECKPOINT_NAME))
    assert saved["epoch"] >= 0 and "epoch 19:" not in stdout
    assert not os.path.exists(os.path.join(run_dir, ".lock"))
