"""Exact resume: a run killed with ``kill -9`` at random points, or interrupted by Ctrl-C, SIGTERM, SIGHUP or a
SIGTERM to torchrun, saves what it can and resumes to weights bitwise equal to an uninterrupted run's; the RNG state
and each epoch's sample order depend only on what a checkpoint records (issues 12 and 24).

Runs of ``experiments/segmentation/train.py`` on a generated ``shapes`` set in subprocesses (see ``_DRIVER``), so
that kills and signals land inside training.
"""
import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, load_script
from training_runs import SigintAt, run_dir_of, run_script

from encoding.engine import GracefulInterrupt, state
from encoding.utils import load_checkpoint, save_checkpoint
from encoding.utils.checkpoint import CHECKPOINT_NAME
from encoding.utils.determinism import EpochSampler, SeededSamples, rng_state, set_rng_state


#: Runs train.py's command line in a subprocess on the small shapes set (``sys.argv[1:]`` are its options).
_DRIVER = ("import sys; sys.path[:0] = ['tests', 'experiments/segmentation']; from conftest import tiny_shapes_pair; "
           "import train; sys.exit(train.cli(sys.argv[1:], datasets=tiny_shapes_pair(num_train=32)))")


# FCN-ResNet18 (not the lighter default model) on 32 training scenes (8 iterations an epoch): an epoch lasts long
# enough for kills and signals to land inside training.
RUN = ["--model", "fcn", "--backbone", "resnet18", "--crop-size", "32", "--base-size", "40", "--batch-size", "4",
       "--workers", "0", "--deterministic", "--val-limit", "2"]


EPOCHS = 2


def _spawn(data, out, extra, **kwargs):
    env = {**os.environ, "ENCODING_DATA": str(data), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", _DRIVER, *RUN, "--output-dir", str(out), *extra], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _resume_args(run_dir):
    """``--resume`` the file the run continues from when one was written (a kill may come before the first one)."""
    path = state.resumable(run_dir)
    return ["--resume", path] if path else []


def _finished(run_dir):
    """Whether the run's checkpoint completed every epoch (nothing left to resume)."""
    path = os.path.join(run_dir, CHECKPOINT_NAME)
    return os.path.exists(path) and state.read(path).finished(EPOCHS)


def _wait_until_training(proc):
    """Block until the run printed its summary line (the model is built, training starts); the lines before it
    (``data: writing ... to``, where generated data go) are passed over."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "writing to" in line:
            return
    raise AssertionError("the run ended before training: " + "".join(lines) + proc.stderr.read())


def _wait_until_iterating(proc):
    """Block until the run's progress lines (stderr) say its first training iteration is done, 7 of 8 to go: a
    signal sent now lands inside the first epoch's training, however loaded the machine (a time measured on another
    run does not)."""
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if re.match(r"train 0:.* [1-6]/8 ", line):
            return
    raise AssertionError("the run ended before its first iteration: " + "".join(lines))


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
    its training took and how long its first epoch took (seconds, from the epochs' summary lines, each printed once
    the epoch's checkpoint is written: what follows the last epoch, e.g. the curves plot, does not count)."""
    base = tmp_path_factory.mktemp("reference")
    proc = _spawn(base / "data", base / "runs", ["--epochs", str(EPOCHS)])
    _wait_until_training(proc)
    started = time.monotonic()
    first_epoch = duration = None
    for line in proc.stdout:
        if line.startswith("epoch 0:"):
            first_epoch = time.monotonic() - started
        if line.startswith(f"epoch {EPOCHS - 1}:"):
            duration = time.monotonic() - started
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and None not in (first_epoch, duration), out + err
    return (base / "data", _weights(os.path.join(run_dir_of(base / "runs", "fcn"), CHECKPOINT_NAME)), duration,
            first_epoch)


# -- kill -9, then resume ----------------------------------------------------------------------------------------------
def test_kill_9_at_random_points_then_resume_ends_bitwise_equal(reference, tmp_path):
    data, expected, duration, first_epoch = reference
    out = tmp_path / "runs"
    run_dir, rng = run_dir_of(out, "fcn"), random.Random(12)
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


#: The driver of a run that dies (as from ``kill -9``) between the two writes of its first epoch's end: after
#: ``model_best.pth``, before ``checkpoint.pth``.
_DIES_BETWEEN_WRITES = ("import os; import encoding.utils.checkpoint as c; write = c.atomic_write; "
                        f"c.atomic_write = lambda p, d: os._exit(9) if p.endswith('{CHECKPOINT_NAME}') else write(p, d)"
                        "; " + _DRIVER)


def test_a_run_killed_between_its_first_two_writes_is_refused_naming_the_best_file_and_resumes_from_it(
        reference, tmp_path, monkeypatch, capsys):
    data, expected, _, _ = reference
    out = tmp_path / "runs"
    run_dir = run_dir_of(out, "fcn")
    env = {**os.environ, "ENCODING_DATA": str(data)}
    died = subprocess.run([sys.executable, "-c", _DIES_BETWEEN_WRITES, *RUN, "--output-dir", str(out), "--epochs",
                           str(EPOCHS)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert died.returncode == 9, died.stdout + died.stderr
    assert os.path.isfile(os.path.join(run_dir, "model_best.pth")) and not _finished(run_dir)
    assert not os.path.exists(os.path.join(run_dir, CHECKPOINT_NAME))
    monkeypatch.setenv("ENCODING_DATA", str(data))  # a start without --resume: refused before any work (in process)
    assert run_script("train", RUN + ["--output-dir", str(out), "--epochs", str(EPOCHS)]) == 2
    best, stderr = os.path.join(run_dir, "model_best.pth"), capsys.readouterr().err
    assert f"continue it with --resume {best}," in stderr, stderr
    resumed = _spawn(data, out, ["--epochs", str(EPOCHS), "--resume", best])
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0 and _finished(run_dir), stdout + stderr
    _assert_bitwise_equal(_weights(os.path.join(run_dir, CHECKPOINT_NAME)), expected)


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


# -- Ctrl-C, SIGTERM, SIGHUP -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_sigterm_and_sighup_save_a_mid_epoch_checkpoint_and_resume_continues_exactly(signum, reference,
                                                                                              tmp_path):
    data, expected, duration, first_epoch = reference
    out = tmp_path / "runs"
    checkpoint = os.path.join(run_dir_of(out, "fcn"), CHECKPOINT_NAME)
    proc = _spawn(data, out, ["--epochs", str(EPOCHS)])
    _wait_until_training(proc)
    _wait_until_iterating(proc)  # inside the first epoch's training, whatever the run does after its last
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    last = stderr.strip().splitlines()[-1]
    by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"  # 130, 143, 129
    assert proc.returncode == 128 + signum and last.startswith(f"train.py: interrupted{by} "), stdout + stderr
    assert "Traceback" not in stderr and f"--resume {checkpoint}" in last
    assert not os.path.exists(os.path.join(run_dir_of(out, "fcn"), ".lock"))  # released
    saved = load_checkpoint(checkpoint)
    assert saved["iteration"] > 0 or "while evaluating" in last
    if signum != signal.SIGINT:
        return  # the resume of a checkpoint saved on a signal does not depend on the signal: SIGINT's shows it
    proc = _spawn(data, out, ["--epochs", str(EPOCHS), "--resume", checkpoint])
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout + stderr
    _assert_bitwise_equal(_weights(checkpoint), expected)


def test_second_ctrl_c_exits_at_once(monkeypatch, capsys):
    before = signal.getsignal(signal.SIGINT)  # Python's default_int_handler; SIG_IGN in a background job
    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    monkeypatch.setattr(GracefulInterrupt, "DUPLICATE_S", 0.0)  # a repeat within it is the same request
    with GracefulInterrupt() as interrupt:
        signal.raise_signal(signal.SIGINT)
        assert interrupt.requested() and not exits
        signal.raise_signal(signal.SIGINT)
        assert exits == [130]
    assert "second SIGINT: exiting now" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_a_signal_arriving_during_the_ranks_agreement_is_kept_for_the_next_poll(monkeypatch):
    """Under torch.distributed ``poll`` all-reduces the request. A signal whose handler runs as that reduce returns
    (Python runs handlers between bytecodes, after the blocking call) must not be overwritten by the agreement
    (the other rank saw none): this poll answers what every rank reported (no), the next one stops every rank. It
    was lost: a SIGTERM to torchrun then left both ranks training until torchrun killed them, without a checkpoint."""
    from encoding.engine import signals as engine_signals

    interrupt = GracefulInterrupt()
    reported = []

    def reduce(value, op):  # the other rank reports 0; this rank's SIGTERM arrives during the first reduce
        reported.append(value)
        if len(reported) == 1:
            interrupt._handle(signal.SIGTERM, None)
        return value

    monkeypatch.setattr(engine_signals, "is_dist_avail_and_initialized", lambda: True)
    monkeypatch.setattr(engine_signals, "reduce_across_processes", reduce)
    assert interrupt.poll() is False  # what every rank reported: no rank stops at this iteration
    assert interrupt.poll() is True and interrupt.exit_status == 128 + signal.SIGTERM
    assert reported == [0, signal.SIGTERM]


def test_sigterm_to_torchrun_saves_on_the_main_process_and_no_rank_hangs(reference, tmp_path):
    data = reference[0]
    out = tmp_path / "runs"
    run_dir = run_dir_of(out, "fcn")
    env = {**os.environ, "ENCODING_DATA": str(data), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "--no-python", sys.executable, "-c", _DRIVER, *RUN, "--output-dir", str(out),
                             "--epochs", "20", "--batch-size", "1", "--no-cuda", "--dist-timeout", "60"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_training(proc)
    line = proc.stdout.readline()
    while line.startswith("estimated whole run"):  # RunEstimate's line comes before the epoch's
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
    if saved["iteration"]:  # the running loss / lr totals of the epoch, summed over both ranks
        assert [saved["epoch_totals"][k][1] for k in ("loss", "lr")] == [2 * saved["iteration"]] * 2


@pytest.mark.parametrize("iteration", [1, 2])  # in the middle of epoch 0, and after its last iteration
def test_an_epoch_resumed_mid_way_logs_the_loss_and_rate_of_the_whole_epoch(tiny_shapes, tmp_path, iteration):
    """Before: the loss and lr logged for the resumed epoch were the means of the iterations after the resume only
    (and after a stop at the epoch's last iteration, no loss and ``lr: null``, the CSV columns reordered). The
    mid-epoch checkpoint holds the running totals: the resumed run's logs equal the uninterrupted run's, byte for
    byte."""
    from encoding.engine import RunInterrupted, run_training

    options = load_script("options")
    argv = TINY[:-2] + ["--epochs", "2", "--deterministic"]

    def train(out, *extra, hooks=()):
        return run_training(options.training_config(argv + ["--output-dir", str(out), *extra]), tiny_shapes,
                            hooks=hooks)

    train(tmp_path / "whole")
    with pytest.raises(RunInterrupted):
        train(tmp_path / "cut", hooks=[SigintAt(0, iteration)])
    checkpoint = os.path.join(run_dir_of(tmp_path / "cut"), CHECKPOINT_NAME)
    assert load_checkpoint(checkpoint)["iteration"] == iteration
    train(tmp_path / "cut", "--resume", checkpoint)
    for name in ("log.csv", "log.jsonl"):
        whole = open(os.path.join(run_dir_of(tmp_path / "whole"), name)).read()
        assert open(os.path.join(run_dir_of(tmp_path / "cut"), name)).read() == whole, name
    assert '"loss"' in whole and '"lr": null' not in whole
