"""One error base with an exit status; the scripts print it in one line, a bug keeps its traceback."""
import importlib
import pkgutil

import pytest
from conftest import load_script

from encoding.datasets import DatasetError
from encoding.datasets.prepare.download import DownloadError
from encoding.engine import RunFailed, RunInterrupted
from encoding.engine.assemble import ConfigError
from encoding.errors import EncodingError, MissingDependency, UsageError
from encoding.export.core import ExportError
from encoding.models.weights import WeightsUnavailable
from encoding.utils.checkpoint import CheckpointError, NonFiniteError
from encoding.utils.cli import run_cli
from encoding.utils.configfile import ConfigFileError
from encoding.utils.files import ChecksumError
from encoding.utils.monitor import MonitorUnavailable
from encoding.utils.rundir import RunDirLocked


@pytest.mark.parametrize("cls, other_base, status", [
    (ConfigError, ValueError, 2), (ConfigFileError, ValueError, 2), (UsageError, ValueError, 2),
    (MonitorUnavailable, ImportError, 2), (MissingDependency, ImportError, 2),
    (RunFailed, RuntimeError, 1), (RunDirLocked, RuntimeError, 1), (CheckpointError, ValueError, 1),
    (CheckpointError, RuntimeError, 1), (DatasetError, ValueError, 2), (NonFiniteError, FloatingPointError, 1),
    (ExportError, RuntimeError, 1), (DownloadError, RuntimeError, 1), (ChecksumError, RuntimeError, 1),
    (WeightsUnavailable, RuntimeError, 1),
])
def test_every_one_line_error_is_an_encoding_error_and_keeps_its_base(cls, other_base, status):
    assert issubclass(cls, EncodingError) and issubclass(cls, other_base) and cls.exit_status == status


def test_an_interrupt_is_no_exception_of_the_package():
    """``except Exception`` (and ``except EncodingError``) let a saved interrupt through; its type tells it apart."""
    stop = RunInterrupted("interrupted after epoch 0; saved x", 143)
    assert isinstance(stop, SystemExit) and not isinstance(stop, Exception) and stop.code == 143


def _main_raising(error):
    def main(argv, *args, **kwargs):  # also stands for load_model(path, trust_code=...)
        main.argv = argv
        raise error
    return main


def test_run_cli_prints_a_known_error_in_one_line_with_its_status(capsys, monkeypatch):
    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    assert run_cli("prog", _main_raising(ConfigError("--epochs 0: must be positive\nmore")), []) == 2
    assert capsys.readouterr().err == "prog: error: --epochs 0: must be positive\n"
    assert run_cli("prog", _main_raising(FileNotFoundError(2, "No such file", "x.pth")), []) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert run_cli("prog", _main_raising(RunInterrupted("interrupted in epoch 1; saved x", 130)), []) == 130
    assert capsys.readouterr().err == "prog: interrupted in epoch 1; saved x\n"


def test_run_cli_keeps_the_traceback_of_an_unexpected_exception(capsys, monkeypatch):
    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    for bug in (RuntimeError("CUDA error: device-side assert\nline two"), TypeError("bad operand"),
                ValueError("an internal invariant")):
        assert run_cli("prog", _main_raising(bug), []) == 1
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err and f"{type(bug).__name__}: {bug}" in err, err
        assert err.strip().splitlines()[-1] == "prog: unexpected error (a bug: please report it with the traceback " \
            "above)"


def test_an_unexpected_error_in_a_torchrun_job_may_be_another_ranks_failure(capsys, monkeypatch):
    """A rank stopped by a bad file closes its connections and the others' next collective fails: their last line
    said "a bug: please report it" of what was the data's failure on another rank."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    peer_gone = RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:3500: Connection reset by peer")
    assert run_cli("train.py", _main_raising(peer_gone), []) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("train.py: unexpected error on rank 0 (RuntimeError); in a job of several processes "
                           "another process's failure") and last.endswith("if none failed first, it is a bug: please "
                                                                          "report it with the traceback above"), last


@pytest.mark.parametrize("how", ["flag", "env"])
def test_traceback_flag_and_variable_show_the_trace_of_a_known_error(how, capsys, monkeypatch):
    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    argv = ["--epochs", "1"]
    if how == "flag":
        argv.append("--traceback")
    else:
        monkeypatch.setenv("ENCODING_TRACEBACK", "1")
    main = _main_raising(CheckpointError("x.pth is not a checkpoint"))
    assert run_cli("prog", main, argv) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.endswith("prog: error: x.pth is not a checkpoint\n")
    assert main.argv == ["--epochs", "1"]  # the flag is the runner's: main never sees it


@pytest.mark.parametrize("script", ["train", "test", "demo"])
def test_each_script_reports_its_known_error_in_one_line(script, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    broken = tmp_path / "broken.pth"
    broken.write_bytes(b"not a checkpoint")
    extra = {"train": ["--output-dir", str(tmp_path / "out"), "--workers", "0"], "test": ["--workers", "0"],
             "demo": [str(tmp_path / "x.png"), "--out-dir", str(tmp_path / "o")]}[script]
    try:
        status = load_script(script).cli(extra + ["--resume", str(broken)])
    except SystemExit as stop:  # test/demo check the checkpoint while parsing: an argument error
        status = stop.code
    err = capsys.readouterr().err.strip().splitlines()
    assert status in (1, 2) and len(err) == 1 and "broken.pth" in err[0] and "not a checkpoint" in err[0], err


def test_test_py_keeps_the_traceback_of_a_torch_error(tiny_run, tmp_path, capsys, monkeypatch):
    """test.py used to print the first line of any RuntimeError: a genuine bug showed no traceback."""
    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    test = load_script("test")

    def broken(*args, **kwargs):
        raise RuntimeError("Expected all tensors to be on the same device\nsecond line of torch's message")
    monkeypatch.setattr(test, "build_evaluation", broken)
    assert test.cli(["--resume", tiny_run[1], "--workers", "0", "--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "second line of torch's message" in err


def test_memory_and_export_clis_report_in_one_line_and_keep_bugs(tmp_path, capsys, monkeypatch):
    from encoding.export import cli as export_cli
    from encoding.memory import cli as memory_cli

    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    argv = ["--simulate", "2", "--out-dir", str(tmp_path)]
    monkeypatch.setattr(memory_cli, "memory_report", _main_raising(MissingDependency("needs X: pip install X")))
    assert memory_cli.cli(argv) == 2
    assert capsys.readouterr().err == "python -m encoding.memory: error: needs X: pip install X\n"
    monkeypatch.setattr(memory_cli, "memory_report", _main_raising(KeyError("a bug")))
    assert memory_cli.cli(argv) == 1 and "Traceback" in capsys.readouterr().err
    monkeypatch.setattr(export_cli, "load_model", _main_raising(AttributeError("a bug in export")))
    assert export_cli.cli(["--resume", "x.pth", "--format", "onnx", "--output", str(tmp_path / "m.onnx")]) == 1
    assert "AttributeError: a bug in export" in capsys.readouterr().err


def test_prepare_shows_the_trace_on_request(tmp_path, capsys, monkeypatch):
    from encoding.datasets import prepare

    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    argv = ["ade20k", "--root", str(tmp_path / "data"), "--mirror", str(tmp_path / "none"), "--no-progress"]
    assert prepare.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert prepare.main(argv + ["--traceback"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["flag", "env"])
def test_train_py_shows_the_trace_of_its_error_on_request(how, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    broken = tmp_path / "broken.pth"
    broken.write_bytes(b"not a checkpoint")
    argv = ["--output-dir", str(tmp_path / "out"), "--workers", "0", "--resume", str(broken)]
    if how == "flag":
        argv.insert(0, "--traceback")  # anywhere on the command line
    else:
        monkeypatch.setenv("ENCODING_TRACEBACK", "1")
    assert load_script("train").cli(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "CheckpointError" in err
    assert err.strip().splitlines()[-1].startswith("train.py: error: ") and "broken.pth" in err


def _package_modules():
    """Every module of ``encoding`` (``__main__`` modules, which run a command, left out), imported."""
    import encoding

    names = [info.name for info in pkgutil.walk_packages(encoding.__path__, "encoding.")
             if not info.name.endswith(".__main__")]
    return [importlib.import_module(name) for name in sorted(names)]


def _exception_classes(module):
    """The exception classes ``module`` defines, at its top level and inside its classes."""
    found, seen = [], set()
    pending = [obj for obj in vars(module).values() if isinstance(obj, type)]
    while pending:
        cls = pending.pop()
        if id(cls) in seen or cls.__module__ != module.__name__:
            continue
        seen.add(id(cls))
        pending.extend(obj for obj in vars(cls).values() if isinstance(obj, type))
        if issubclass(cls, BaseException) and not issubclass(cls, Warning):
            found.append(cls)
    return found


def test_every_exception_class_of_the_package_derives_from_encoding_error():
    """One error root: each exception class defined anywhere in ``encoding`` is an EncodingError, except the
    documented interrupts, which ``except Exception`` must let through: a run's (a SystemExit) and the web page's
    SIGTERM (a KeyboardInterrupt, on which Gradio closes its server)."""
    modules = _package_modules()
    assert len(modules) > 100  # the walk saw the package
    classes = {f"{cls.__module__}.{cls.__qualname__}": cls for m in modules for cls in _exception_classes(m)}
    assert {"encoding.errors.UsageError", "encoding.models.multieval.InferenceOptionError",
            "encoding.engine.signals.Interrupted", "encoding.parallel.parallel_apply.ReplicaAbortedError"} <= set(classes)
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, EncodingError))
    assert outside == ["encoding.app.cli.Stopped", "encoding.errors.RunInterrupted"], outside
    assert issubclass(RunInterrupted, SystemExit) and issubclass(classes["encoding.app.cli.Stopped"], KeyboardInterrupt)


def test_dataset_errors_are_one_class():
    from encoding.datasets import folder_meta, layout

    assert folder_meta.DataError is DatasetError is layout.DatasetError  # the old name, bound as it is
    assert DatasetError("x.png", "mask file is missing").exit_status == 2


def test_a_stride_past_the_window_is_a_one_line_usage_error(tiny_run, tmp_path, capsys, monkeypatch):
    """test.py --mode slide --window 16 --stride 40: a refusal in one line with exit status 2, not a traceback."""
    monkeypatch.delenv("ENCODING_TRACEBACK", raising=False)
    argv = ["--resume", tiny_run[1], "--workers", "0", "--out-dir", str(tmp_path), "--mode", "slide", "--window",
            "16", "--stride", "40"]
    assert load_script("test").cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stride 40 is larger than the window 16" in err[0], err
