"""Round 2 of the run's rules (issues 23 and 24): every unusable option value is one line before any work, a run
directory holds one run, a resume honours what it can and refuses the rest, whole-image evaluation and saved masks.

Tiny CPU runs on conftest.py's generated ``shapes`` sets.
"""
import csv
import os

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import TINY, load_script, tiny_eval_set
from encoding.utils import load_checkpoint
from encoding.utils.checkpoint import CHECKPOINT_NAME, NonFiniteError


def _cli(script, argv, **kwargs):
    """The exit status of ``<script>.py`` (an argument error exits through ``SystemExit``)."""
    try:
        return load_script(script).cli(argv, **kwargs)
    except SystemExit as stop:
        return stop.code


def _run_dir(out, model="unet"):
    return os.path.join(str(out), "shapes", model, "default")


# -- issue 24 item 13, issue 23 item 3: one line, exit 2, nothing left behind ---------------------------------------
TRAIN_BAD = [
    (["--backbone", "nosuch"], "unknown backbone 'nosuch'"),
    (["--model", "nosuch"], "unknown segmentation model 'nosuch'"),
    (["--dataset", "nosuch"], "--dataset nosuch: unknown dataset"),
    (["--device-ids", "cuda:0"] if not torch.cuda.is_available() else ["--device-ids", "cuda:99"], "--device-ids"),
    (["--device-ids", "cpu,xyz"], "--device-ids cpu,xyz"),
    (["--device-ids", "0,0"], "--device-ids 0,0"),
    (["--device-ids", "-1"], "--device-ids -1"),
    (["--device-ids", "cpu,,cpu"], "--device-ids cpu,,cpu: empty entry"),
    (["--model", "deeplab", "--backbone", "vgg_tiny", "--output-stride", "32"], "output_stride of vgg_tiny"),
    (["--head-channels", "8"], "model 'unet' has no head option channels"),
    (["--warmup-epochs", "3", "--epochs", "2"], "--warmup-epochs 3 is longer than the run"),
    (["--lr-scheduler", "step"], "--lr-scheduler step needs --lr-step"),
    (["--train-split", "test"], "--train-split test"),
    (["--val-split", "nosuch"], "--val-split nosuch"),
]


@pytest.mark.parametrize("argv, message", TRAIN_BAD, ids=[" ".join(a) for a, _ in TRAIN_BAD])
def test_train_py_refuses_every_unusable_value_in_one_line_leaving_nothing(argv, message, tmp_path, monkeypatch,
                                                                             capsys):
    monkeypatch.setenv("ENCODING_DATA", str(tmp_path / "data"))
    status = _cli("train", argv + ["--output-dir", str(tmp_path / "runs"), "--workers", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("train.py: error: ") and message in err[0], err
    assert os.listdir(tmp_path) == []  # no run directory, no generated data


@pytest.mark.parametrize("script", ["test", "demo"])
@pytest.mark.parametrize("argv, message", [
    (["--backbone", "nosuch"], "unknown backbone 'nosuch'"),
    (["--dataset", "nosuch"], "--dataset nosuch: unknown dataset"),
    (["--device-ids", "cpu,xyz"], "--device-ids cpu,xyz"),
    (["--device-ids", "-1"], "--device-ids -1"),
])
def test_test_and_demo_refuse_unusable_values_in_one_line(script, argv, message, tiny_run, tmp_path, capsys):
    _, checkpoint, _ = tiny_run
    extra = [str(tmp_path / "x.png"), "--out-dir", str(tmp_path / "demo")] if script == "demo" else ["--workers", "0"]
    status = _cli(script, extra + ["--resume", checkpoint, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and message in err[0], err
    assert os.listdir(tmp_path) == []


def test_test_py_refuses_a_split_without_masks_for_scoring(tiny_run, capsys):
    status = _cli("test", ["--resume", tiny_run[1], "--split", "nosuch", "--workers", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--split nosuch" in err[0], err


def test_a_late_failure_leaves_no_empty_run_directory(tiny_shapes, tmp_path, capsys):
    """A failure after the checks (here: a checkpoint of another network) removes the folders the run made."""
    _, checkpoint = _train(tiny_shapes, tmp_path / "first")
    out = tmp_path / "runs"
    status = _cli("train", TINY[:-2] + ["--epochs", "2", "--model", "fcn", "--backbone", "resnet18", "--resume",
                                        checkpoint, "--output-dir", str(out)], datasets=tiny_shapes)
    assert status == 1 and not out.exists(), capsys.readouterr().err


# -- issue 23 item 7: one run per directory, over time ----------------------------------------------------------------
def _train(datasets, out, *extra, epochs=1):
    argv = TINY[:-2] + ["--epochs", str(epochs), "--output-dir", str(out), *extra]
    status = _cli("train", argv, datasets=datasets)
    return status, os.path.join(_run_dir(out), CHECKPOINT_NAME)


def _log_epochs(out):
    with open(os.path.join(_run_dir(out), "log.csv")) as f:
        return [row["epoch"] for row in csv.DictReader(f)]


def test_a_started_run_directory_is_refused_unless_resume_or_overwrite(tiny_shapes, tmp_path, capsys):
    assert _train(tiny_shapes, tmp_path)[0] == 0
    best = os.path.join(_run_dir(tmp_path), "model_best.pth")
    before = os.stat(best).st_mtime_ns
    capsys.readouterr()
    status, checkpoint = _train(tiny_shapes, tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--resume" in err[0] and "--overwrite" in err[0], err
    assert os.stat(best).st_mtime_ns == before and _log_epochs(tmp_path) == ["0"]
    assert _train(tiny_shapes, tmp_path, "--resume", checkpoint, epochs=2)[0] == 0
    assert _log_epochs(tmp_path) == ["0", "1"]
    assert _train(tiny_shapes, tmp_path, "--overwrite")[0] == 0  # a new run: the old files are gone
    assert _log_epochs(tmp_path) == ["0"] and load_checkpoint(checkpoint)["epoch"] == 0


def test_parsing_options_never_looks_at_run_directories(tmp_path, monkeypatch):
    """Issue 32: a user's finished default run in the working directory does not stop option parsing (``--help``,
    the docs build, the suite); starting a run there is what is refused."""
    monkeypatch.chdir(tmp_path)
    started = tmp_path / "runs" / "shapes" / "unet" / "default"
    started.mkdir(parents=True)
    (started / CHECKPOINT_NAME).write_bytes(b"a finished run")
    options = load_script("options")
    args = options.parse_args([])
    assert args.output_dir == "runs" and args.checkname == "default"
    from encoding.engine import TrainingConfig
    from encoding.engine.config import ConfigError, check_run_dir, check_training

    config = TrainingConfig(**vars(args))
    check_training(config)  # every value is usable
    with pytest.raises(ConfigError, match="already holds a run"):
        check_run_dir(config)
    check_run_dir(TrainingConfig(**vars(options.parse_args(["--overwrite"]))))
    assert (started / CHECKPOINT_NAME).read_bytes() == b"a finished run"


# -- issue 24 items 7 and 8: what a resume honours ------------------------------------------------------------------------
def _mid_epoch(checkpoint, iteration):
    data = load_checkpoint(checkpoint, map_location="cpu")
    data.update(epoch=-1, iteration=iteration)
    torch.save(data, checkpoint)


def test_a_mid_epoch_checkpoint_refuses_another_batch_size(tiny_shapes, tmp_path, capsys):
    status, checkpoint = _train(tiny_shapes, tmp_path, "--batch-size", "2", "--train-limit", "8")
    assert status == 0
    _mid_epoch(checkpoint, 3)
    capsys.readouterr()
    status = _train(tiny_shapes, tmp_path, "--batch-size", "4", "--train-limit", "8", "--resume", checkpoint)[0]
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--batch-size 4" in err[0] and "--batch-size 2" in err[0], err
    assert load_checkpoint(checkpoint)["iteration"] == 3  # nothing was trained or written
    assert _train(tiny_shapes, tmp_path, "--batch-size", "2", "--train-limit", "8", "--resume", checkpoint)[0] == 0
    assert load_checkpoint(checkpoint)["epoch"] == 0


def test_resume_trains_with_the_given_weight_decay_and_records_it(tiny_shapes, tmp_path):
    status, checkpoint = _train(tiny_shapes, tmp_path)
    assert status == 0
    assert _train(tiny_shapes, tmp_path, "--resume", checkpoint, "--weight-decay", "0.5", epochs=2)[0] == 0
    saved = load_checkpoint(checkpoint)
    assert saved["args"]["weight_decay"] == 0.5
    assert {g["weight_decay"] for g in saved["optimizer"]["param_groups"]} == {0.5}


def test_resume_refuses_another_optimizer_before_work(tiny_shapes, tmp_path, capsys):
    status, checkpoint = _train(tiny_shapes, tmp_path)  # the shapes recipe: adamw
    assert status == 0
    capsys.readouterr()
    assert _train(tiny_shapes, tmp_path, "--resume", checkpoint, "--optimizer", "sgd", epochs=2)[0] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--optimizer sgd" in err[0] and "--optimizer adamw" in err[0] and "--ft" in err[0]
    assert load_checkpoint(checkpoint)["epoch"] == 0


# -- issue 24 item 15: a diverged state names the iteration ------------------------------------------------------------
def test_a_diverged_state_names_epoch_iteration_and_tensor(tiny_shapes, tmp_path, monkeypatch, capsys):
    from encoding.engine import hooks

    def diverged(state, *args, **kwargs):
        raise NonFiniteError("non-finite", "model.head.weight (3 of 9 values NaN/inf)")

    monkeypatch.setattr(hooks, "save_checkpoint", diverged)
    status, _ = _train(tiny_shapes, tmp_path, "--train-limit", "8", "--no-val")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 1 and "epoch 0 by iteration 2" in err and "model.head.weight" in err, err


# -- issue 23 items 1 and 6: whole images at single scale, saved masks at the input's size ---------------------------
def test_testval_single_scale_scores_whole_images(tiny_run, tmp_path):
    base, checkpoint, _ = tiny_run
    test = load_script("test")
    scores = test.main(["--resume", checkpoint, "--mode", "testval", "--limit", "3", "--workers", "0",
                        "--out-dir", str(tmp_path)], data=tiny_eval_set(base, "testval"))
    assert 0 <= scores["mIoU"] <= 1 and scores["confusion"].sum() > 0


def test_saved_predictions_have_the_size_of_their_images(tiny_run, tmp_path, capsys):
    base, checkpoint, _ = tiny_run
    test = load_script("test")
    test.main(["--resume", checkpoint, "--save-pred", str(tmp_path / "preds"), "--workers", "0", "--out-dir",
               str(tmp_path)], data=tiny_eval_set(base, "testval"))  # default mode with --save-pred: testval
    images = tiny_eval_set(base, "test").images
    for path in images:
        name = os.path.splitext(os.path.basename(path))[0] + ".png"
        assert Image.open(tmp_path / "preds" / name).size == Image.open(path).size
    assert np.asarray(Image.open(tmp_path / "preds" / name)).max() < 7
    capsys.readouterr()
    status = _cli("test", ["--resume", checkpoint, "--mode", "val", "--save-pred", str(tmp_path / "v")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--save-pred" in err[0] and not (tmp_path / "v").exists()
