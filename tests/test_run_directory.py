"""One run per run directory: a kernel-held lock refuses a second run (and is taken over from a dead one, not from a
live run in another PID namespace), a started directory is refused unless ``--resume`` or ``--overwrite``, an
unwritable one fails before training, a late failure leaves no empty folders, stale temporary files are cleaned and a
resumed log keeps one row per epoch (issues 12, 23, 24 and 32).
"""
import csv
import errno
import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, TINY, load_script
from training_runs import load_train_script, run_dir_of, run_script, train_tiny

from encoding.utils import EpochLogger, load_checkpoint
from encoding.utils.checkpoint import CHECKPOINT_NAME
from encoding.utils.files import staged_dir
from encoding.utils.rundir import RunDirLock, RunDirLocked, remove_stale_temp_files


# -- the lock ----------------------------------------------------------------------------------------------------------
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


def test_second_training_run_into_a_locked_directory_is_refused_in_one_line(tiny_shapes, tmp_path, capsys):
    script = load_train_script()
    out = str(tmp_path / "runs")
    with RunDirLock(run_dir_of(out)):
        started = time.monotonic()
        assert script.cli(TINY + ["--output-dir", out], datasets=tiny_shapes) == 1
        assert time.monotonic() - started < 5  # refused before building anything
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is in use by another run (pid" in err[0]
    assert not os.path.exists(os.path.join(run_dir_of(out), "log.jsonl"))


def test_unwritable_run_directory_fails_before_training(tiny_shapes, tmp_path, monkeypatch, capsys):
    import encoding.engine.assemble as config
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
    assert "is not writable" in err and run_dir_of(out) in err and not built


# -- one run per directory, over time ----------------------------------------------------------------------------------
def _log_epochs(out):
    with open(os.path.join(run_dir_of(out), "log.csv")) as f:
        return [row["epoch"] for row in csv.DictReader(f)]


def test_a_started_run_directory_is_refused_unless_resume_or_overwrite(tiny_shapes, tmp_path, capsys):
    assert train_tiny(tiny_shapes, tmp_path)[0] == 0
    best = os.path.join(run_dir_of(tmp_path), "model_best.pth")
    before = os.stat(best).st_mtime_ns
    capsys.readouterr()
    status, checkpoint = train_tiny(tiny_shapes, tmp_path)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "--resume" in err[0] and "--overwrite" in err[0], err
    assert os.stat(best).st_mtime_ns == before and _log_epochs(tmp_path) == ["0"]
    assert train_tiny(tiny_shapes, tmp_path, "--resume", checkpoint, epochs=2)[0] == 0
    assert _log_epochs(tmp_path) == ["0", "1"]
    run_dir = run_dir_of(tmp_path)  # the earlier run's TensorBoard / W&B records and hold-out list go with it
    earlier = ["events.out.tfevents.1.host.1", os.path.join("wandb", "offline-run-1", "run.wandb"), "holdout.json"]
    for name in earlier:
        os.makedirs(os.path.dirname(os.path.join(run_dir, name)), exist_ok=True)
        open(os.path.join(run_dir, name), "w").close()
    assert train_tiny(tiny_shapes, tmp_path, "--overwrite")[0] == 0  # a new run: the old files are gone
    assert _log_epochs(tmp_path) == ["0"] and load_checkpoint(checkpoint)["epoch"] == 0
    assert not any(os.path.exists(os.path.join(run_dir, name)) for name in earlier + ["wandb"])
    # a fine-tuning, or a checkpoint of another directory, starts a run of its own: refused there, the files kept
    assert train_tiny(tiny_shapes, tmp_path / "other", epochs=2)[0] == 0
    other = os.path.join(run_dir_of(tmp_path / "other"), "model_best.pth")
    before = os.stat(best).st_mtime_ns
    for extra in (["--resume", other, "--ft"], ["--resume", os.path.join(os.path.dirname(other), CHECKPOINT_NAME)]):
        capsys.readouterr()
        assert train_tiny(tiny_shapes, tmp_path, *extra, epochs=3)[0] == 2
        assert "already holds a run" in capsys.readouterr().err
        assert os.stat(best).st_mtime_ns == before and _log_epochs(tmp_path) == ["0"]
    assert train_tiny(tiny_shapes, tmp_path, "--resume", other, "--ft", "--overwrite", epochs=2)[0] == 0
    assert _log_epochs(tmp_path) == ["0", "1"]  # the fine-tuning's own epochs, the old run's rows gone


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
    from encoding.engine.assemble import ConfigError, check_run_dir, check_training

    config = TrainingConfig(**vars(args))
    check_training(config)  # every value is usable
    with pytest.raises(ConfigError, match="already holds a run"):
        check_run_dir(config)
    check_run_dir(TrainingConfig(**vars(options.parse_args(["--overwrite"]))))
    assert (started / CHECKPOINT_NAME).read_bytes() == b"a finished run"


def test_a_late_failure_leaves_no_empty_run_directory(tiny_shapes, tmp_path, capsys):
    """A failure after the checks (here: a checkpoint of another network) removes the folders the run made."""
    _, checkpoint = train_tiny(tiny_shapes, tmp_path / "first")
    out = tmp_path / "runs"
    status = run_script("train", TINY[:-2] + ["--epochs", "2", "--model", "fcn", "--backbone", "resnet18", "--resume",
                                        checkpoint, "--output-dir", str(out)], datasets=tiny_shapes)
    assert status == 1 and not out.exists(), capsys.readouterr().err


# -- leftovers ---------------------------------------------------------------------------------------------------------
def test_stale_temp_files_and_staging_folders_are_cleaned(tmp_path):
    stale = tmp_path / f".{CHECKPOINT_NAME}.{'ab' * 16}.tmp"
    stale.write_bytes(b"partial")
    keep = tmp_path / "notes.tmp"
    keep.write_text("mine")
    with RunDirLock(str(tmp_path)):
        assert remove_stale_temp_files(str(tmp_path)) == [str(stale)]
    assert keep.exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = tmp_path / f".shapes.tmp-{int(dead.stdout)}-x1"  # an earlier release's name: judged by its pid
    leftover.mkdir()
    alive = tmp_path / f".shapes.tmp-{os.getpid()}-x2"
    alive.mkdir()
    with staged_dir(str(tmp_path / "shapes")) as staging:
        assert os.path.basename(staging).startswith(".shapes.tmp-") and os.path.exists(staging + ".lock")
    assert not leftover.exists() and alive.exists()
    assert sorted(os.listdir(tmp_path)) == sorted([".shapes.tmp-%d-x2" % os.getpid(), "notes.tmp", "shapes"])


_BUILD = """
import os, sys
from encoding.utils.files import staged_dir
with staged_dir(sys.argv[1]) as staging:
    open(os.path.join(staging, "half"), "w").close()
    print(staging, flush=True)
    if sys.argv[2] == "kill":
        os._exit(9)  # killed mid-build: no cleanup runs
    sys.stdin.readline()
"""


def test_a_live_build_keeps_its_staging_folder_and_a_killed_one_loses_it(tmp_path, monkeypatch):
    """Staleness is the staging folder's flock, not a pid (pids mean nothing across PID namespaces): the folder of
    a build that is still running elsewhere is kept, the folder of a killed one is deleted by the next build."""
    import encoding.utils.files as files

    monkeypatch.setattr(files, "pid_alive", lambda pid: False)  # the builders run in another PID namespace
    final = str(tmp_path / "shapes")
    killed = subprocess.run([sys.executable, "-c", _BUILD, final, "kill"], capture_output=True, text=True, cwd=ROOT)
    killed_staging = killed.stdout.strip()
    assert killed.returncode == 9 and os.path.isdir(killed_staging), killed.stderr
    live = subprocess.Popen([sys.executable, "-c", _BUILD, final, "wait"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        live_staging = live.stdout.readline().strip()
        with staged_dir(final) as staging:
            open(os.path.join(staging, "mine"), "w").close()
        assert not os.path.exists(killed_staging) and not os.path.exists(killed_staging + ".lock")
        assert os.path.isfile(os.path.join(live_staging, "half"))  # the live build's work is untouched
    finally:
        live.communicate("go\n", timeout=60)
    assert live.returncode == 0 and os.listdir(final) == ["mine"]  # the first to finish is kept
    assert sorted(os.listdir(tmp_path)) == ["shapes"]


def test_resumed_log_has_one_row_per_epoch(tmp_path):
    with EpochLogger(str(tmp_path)) as log:
        for epoch in range(4):
            log.write(epoch, loss=1.0 / (epoch + 1))
        log.resume_after(1)  # resuming a checkpoint of epoch 1: rows 2 and 3 will be written again
        assert [r["epoch"] for r in log.rows()] == [0, 1]
        log.resume_after(2, {"epoch": 2, "loss": 0.3})  # stopped between the checkpoint and its log row
        assert [r["epoch"] for r in log.rows()] == [0, 1, 2]
    assert [line.split(",")[0] for line in open(tmp_path / "log.csv")] == ["epoch", "0", "1", "2"]


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_log_row_cut_short_by_a_kill_is_written_whole_by_the_resume(tmp_path, cut):
    """A kill in the middle of epoch 2's appends leaves a last row without its line end: the resume from the
    checkpoint of epoch 2 drops it and writes the row whole, so the next epoch's row is not glued onto it."""
    row = {"loss": 0.25, "mIoU": 0.5, "per_class": [0.5, 0.5]}
    with EpochLogger(str(tmp_path)) as log:
        for epoch in range(3):
            log.write(epoch, **row)
    whole = {name: (tmp_path / name).read_bytes() for name in ("log.csv", "log.jsonl")}
    for name, text in whole.items():  # the last row cut `cut` bytes before its end
        (tmp_path / name).write_bytes(text[:-cut])
    with EpochLogger(str(tmp_path)) as log:
        log.resume_after(2, {"epoch": 2, **row})
        assert {name: (tmp_path / name).read_bytes() for name in whole} == whole
        log.write(3, **row)
        assert [r["epoch"] for r in log.rows()] == [0, 1, 2, 3]
    with open(tmp_path / "log.csv", newline="") as f:
        records = list(csv.reader(f))
    assert [r[0] for r in records] == ["epoch", "0", "1", "2", "3"]
    assert {len(r) for r in records} == {len(records[0])}
