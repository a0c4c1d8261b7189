"""Unusable options of train.py, test.py and demo.py: one line, exit status 2, before any work and leaving nothing
behind (issues 12, 23, 24 and 35).
"""
import os

import pytest
import torch
from training_runs import load_train_script, run_dir_of, run_script

from encoding.utils import EpochLogger, load_checkpoint
from encoding.utils.checkpoint import BEST_NAME, save_checkpoint
from encoding.utils.plot import CURVES_NAME
from encoding.utils.rundir import LOCK_NAME, RunDirLock


# -- train.py ----------------------------------------------------------------------------------------------------------
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
    (["--ft"], "--ft fine-tunes the weights of a checkpoint: pass --resume"),
    (["--resume", __file__, "--start-epoch", "2"], "--start-epoch 2: a resume continues at its checkpoint's epoch"),
])
def test_bad_options_fail_in_one_line_with_status_2(argv, message, capsys):
    script = load_train_script()
    with pytest.raises(SystemExit) as info:
        script.parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("options, message", [
    (dict(eval=True), "--eval evaluates a checkpoint: pass --resume"),
    (dict(start_epoch=3, epochs=1), "--start-epoch 3 must be below --epochs 1"),
    (dict(ft=True), "--ft fine-tunes the weights of a checkpoint"),
])
def test_the_python_api_refuses_what_train_py_refuses_before_any_work(options, message, tmp_path):
    """``run_training(TrainingConfig(eval=True))`` scored an untrained network; train.py refused it."""
    from encoding.engine import TrainingConfig, run_training
    from encoding.engine.assemble import ConfigError

    with pytest.raises(ConfigError, match=message):
        run_training(TrainingConfig(output_dir=str(tmp_path), **options))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, message", [
    (["--balance", "memory"], "--balance memory splits a batch over the devices of one process; under torchrun"),
    (["--device-ids", "cpu,cpu"], "--device-ids cpu,cpu: under torchrun each process takes cuda:LOCAL_RANK"),
])
def test_one_process_device_options_are_refused_under_torchrun(argv, message, capsys, monkeypatch):
    """Under torchrun each process has one device: --balance failed after the data was built (a traceback labelled a
    bug), --device-ids was ignored."""
    script = load_train_script()
    script.parse_args(argv + ["--device-ids", "cpu,cpu"] * ("--device-ids" not in argv))  # one process, 2 devices
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
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
    assert not os.path.exists(run_dir_of(tmp_path))  # another run's checkpoint: its run directory is not made


def test_a_finished_run_killed_after_its_last_checkpoint_is_completed_by_its_resume(tmp_path, capsys):
    run_dir = run_dir_of(tmp_path)  # the last process died after checkpoint.pth, before its log row and its end
    EpochLogger(run_dir, enabled=True).write(3, mIoU=0.25)
    path = save_checkpoint({"model": {}, "epoch": 4, "best_epoch": 4, "log_row": {"epoch": 4, "mIoU": 0.5}}, run_dir)
    leftovers = [os.path.join(run_dir, LOCK_NAME), os.path.join(run_dir, f".log.jsonl.{'ef' * 16}.tmp")]
    for leftover in leftovers:
        open(leftover, "w").close()
    assert load_train_script().cli(["--epochs", "5", "--resume", path, "--output-dir", str(tmp_path)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert not any(os.path.exists(leftover) for leftover in leftovers)
    assert [row["epoch"] for row in EpochLogger(run_dir).rows()] == [3, 4]
    assert load_checkpoint(os.path.join(run_dir, BEST_NAME))["epoch"] == 4
    assert os.path.isfile(os.path.join(run_dir, CURVES_NAME))
    with RunDirLock(run_dir):  # a live run holds the directory: its files are left alone
        open(leftovers[1], "w").close()
        assert load_train_script().cli(["--epochs", "5", "--resume", path, "--output-dir", str(tmp_path)]) == 0
        assert os.path.exists(leftovers[1])


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
    status = run_script("train", argv + ["--output-dir", str(tmp_path / "runs"), "--workers", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("train.py: error: ") and message in err[0], err
    assert os.listdir(tmp_path) == []  # no run directory, no generated data


def test_missing_class_weights_file_is_refused_before_the_dataset_is_generated(tmp_path, capsys, monkeypatch):
    from conftest import TINY, load_script

    from encoding.engine import assemble as engine_config

    monkeypatch.setattr(engine_config, "build_training", lambda *a, **k: pytest.fail("work started"))
    root = tmp_path / "data"
    train = load_script("train")
    for spec, says in ((tmp_path / "nope.txt", "No such file"), (tmp_path / "three.txt", "holds 3 class weights"),
                       (tmp_path, "not auto/enet/median")):
        if spec.name == "three.txt":
            spec.write_text("1 2 3")
        with pytest.raises(SystemExit) as stop:  # refused while the options are parsed
            train.cli(TINY + ["--class-weights", str(spec), "--data-root", str(root), "--output-dir",
                              str(tmp_path / "runs")])
        status = stop.value.code
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1 and says in err and f"--class-weights {spec}" in err
    assert not root.exists()  # no dataset generated


@pytest.mark.parametrize("value, says", [("inf", "finite"), ("1e15", "at most"), ("nan", "> 0"), ("-inf", "> 0")])
def test_absurd_dist_timeout_is_one_line(value, says, tmp_path, capsys, monkeypatch):
    from conftest import TINY, load_script

    with monkeypatch.context() as launched, pytest.raises(SystemExit) as stop:  # as torchrun launches a process
        launched.setenv("RANK", "0")
        launched.setenv("WORLD_SIZE", "1")
        load_script("train").cli(TINY + [f"--dist-timeout={value}", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "--dist-timeout" in err and says in err
    from encoding.utils.dist import init_distributed_mode
    if value == "1e15":
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
        try:
            with pytest.raises(ValueError, match="timeout_s 1e\\+15: must be"):
                init_distributed_mode(timeout_s=1e15)
        finally:
            for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                os.environ.pop(name)


# -- test.py and demo.py -----------------------------------------------------------------------------------------------
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
    status = run_script(script, extra + ["--resume", checkpoint, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and message in err[0], err
    assert os.listdir(tmp_path) == []


def test_test_py_refuses_a_split_without_masks_for_scoring(tiny_run, capsys):
    status = run_script("test", ["--resume", tiny_run[1], "--split", "nosuch", "--workers", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--split nosuch" in err[0], err


def test_balance_with_one_device_is_refused(capsys):
    """One process driving one device (the CPU; one GPU): --balance memory was accepted and changed nothing."""
    script = load_train_script()
    for argv in ([], ["--device-ids", "cpu"]):
        with pytest.raises(SystemExit) as info:
            script.parse_args(["--balance", "memory", "--no-cuda", *argv])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "--balance memory splits each batch over several devices; this run has one "\
               "(" in err
    assert script.parse_args(["--balance", "memory", "--device-ids", "cpu,cpu"]).balance == "memory"


def test_a_resume_path_of_a_run_folder_names_the_runs_file(tmp_path, capsys):
    """--resume runs/shapes/unet/default (the folder), or its model_best.pth when the run wrote none: "no such
    file" and nothing more. The run's file is named (model_best.pth, else checkpoint.pth), by train.py and test.py."""
    from conftest import load_script
    from encoding.config.evaluation import resume_problem

    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pth").write_bytes(b"")
    assert resume_problem(str(run)) == f"argument --resume: a folder, not a checkpoint: {run} (the run's file: " \
                                       f"{run / 'checkpoint.pth'})"
    assert resume_problem(str(run / "model_best.pth")).endswith(f"(the run's file: {run / 'checkpoint.pth'})")
    (run / "model_best.pth").write_bytes(b"")
    assert resume_problem(str(run)).endswith(f"(the run's file: {run / 'model_best.pth'})")
    assert resume_problem(str(tmp_path / "x.pth")) == f"argument --resume: no such file: {tmp_path / 'x.pth'}"
    for script in ("train", "test"):
        with pytest.raises(SystemExit) as stop:
            load_script(script).main(["--resume", str(run), "--workers", "0"])
        assert stop.value.code == 2 and "a folder, not a checkpoint" in capsys.readouterr().err
