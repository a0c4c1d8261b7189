"""The memory tool's errors: bad options and unwritable outputs are one line before any work, a report that
cannot be written is one line, and a chart of 100000 devices is drawn in bounded time (issue 35).
"""
import errno

import numpy as np
import pytest


@pytest.mark.parametrize("argv, says", [
    (["--model", "nosuchnet"], "unknown segmentation model 'nosuchnet'"),
    (["--backbone", "nosuch"], "unknown backbone 'nosuch'"),
    (["--model", "psp", "--backbone", "mit_b0"], "--model psp --backbone mit_b0"),
    (["--out-dir", "/proc/encoding-test"], "cannot write '/proc/encoding-test/memory_balance.json'"),
    (["--json", "/proc/encoding-test.json"], "--json"),
    (["--json", "same.out", "--chart", "same.out"], "same file"),
    # accepted and changing nothing before: refused where the run never reads them
    (["--steps", "5"], "--steps is read only with --devices (real GPUs)"),
    (["--seed", "7"], "--seed is read only with --devices or --calibrate (real steps)"),
    (["--backend", "gloo", "--strategies", "ddp"], "--backend is read only with simulated fsdp"),
    (["--reserve", "1GiB"], "--reserve is read only with --advise"),
    (["--data-root", "/nonexistent"], "--data-root is read only with --dataset folder"),
    (["--model", "torchvision:lraspp_mobilenet_v3_large", "--backbone", "resnet101"],
     "--backbone is read only with a network of the toolkit's (not a model spec)"),
])
def test_memory_tool_bad_options_are_one_line_before_any_work(argv, says, tmp_path, capsys, monkeypatch):
    from encoding.memory import cli, report

    monkeypatch.setattr(report, "memory_report", lambda *a, **k: pytest.fail("work started"))
    base = [] if "--out-dir" in argv or {"--json", "--chart"} <= set(argv) else ["--out-dir", str(tmp_path)]
    try:
        status = cli.cli(base + argv)  # a bad output: one line at the start of the work
    except SystemExit as stop:  # a bad model: argparse's line while parsing
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and says in err


def test_memory_tool_report_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    from encoding.memory import cli

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, f"cannot write {tmp_path}/memory_balance.json: No space left on device")

    monkeypatch.setattr(cli, "memory_report", lambda args, **kwargs: {"strategies": {}, "config": {}})
    monkeypatch.setattr(cli, "format_report", lambda report: "table")
    monkeypatch.setattr(cli, "write_json", full)
    assert cli.cli(["--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left" in err


def test_memory_chart_of_100000_devices_is_drawn_in_bounded_time(tmp_path):
    import time

    from encoding.memory.report import write_chart

    count = 100_000
    peaks = list(np.linspace(100.0, 200.0, count))
    report = {"strategies": {s: {"peak_mib": peaks} for s in ("gather", "balanced")},
              "config": {"model": "fcn", "backbone": "resnet50", "nclass": 21, "batch_size": count,
                         "crop_size": 480, "devices": count, "recompute": "none", "amp": None, "calibrate": False,
                         "memory_limit": "11GiB", "memory_limit_mib": 11264.0, "mode": "simulated"}}
    started = time.perf_counter()
    assert write_chart(report, str(tmp_path / "chart.png"))
    assert time.perf_counter() - started < 60
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chart.png"]
