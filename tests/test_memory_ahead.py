"""The advice's traces simulated ahead in a second process (issue 45, item 1: encoding.memory.ahead): the traces
planned are the ones the advice asks for, traces made on another process's simulators give the same answers, the
command line forks the process and answers what one process answers, and a process that cannot fork (or whose
fork autograd refuses: forked after a simulation) falls back to simulating everything itself."""
import json
import os
import subprocess
import sys

import pytest

from encoding.memory import Simulator
from encoding.memory import ahead as ahead_module
from encoding.memory.advice import advice_peaks, advise, planned_traces
from encoding.memory.tracker import CUDA_BLOCK, MIB

from test_memory_replay import STRATEGIES, direct, fcn_spec

DEVICES, CROP = 3, 32
POLICIES = ("none", "backbone", "all")
#: where a fresh interpreter forks its second process (this one may run other tests' threads: can_fork() says no)
FORKS = sys.platform.startswith("linux") and len(os.sched_getaffinity(0)) >= 2


class Asked:
    """An ``ahead`` that records what the advice asks for and serves the traces and peaks of ``peaks`` (a second
    process's :func:`advice_peaks`), or nothing."""

    def __init__(self, peaks=None):
        self.asked, self.asked_peaks, self.peaks, self.taken = [], [], peaks, 0

    def take(self, key):
        self.asked.append(key)
        self.taken += self.peaks is not None
        return None if self.peaks is None else self.peaks.trace(*key, head=True)

    def ask_peak(self, key):
        self.asked_peaks.append(key)
        return self.peaks is not None

    def peak(self, key):
        self.taken += 1
        return self.peaks.simulated(*key)


def _table():
    """The tool's table simulator: every strategy at the advice's point, recorded."""
    table = Simulator(fcn_spec(CROP, "none"), CUDA_BLOCK, record=True)
    for strategy in STRATEGIES:
        table.peaks(strategy, [2] * DEVICES)
    return table


def _advise(limit, **kwargs):
    return advise(fcn_spec, STRATEGIES, DEVICES, 2 * DEVICES, CROP, limit, CUDA_BLOCK, policies=POLICIES,
                  simulator=("none", _table()), **kwargs)


def test_the_planned_traces_are_the_ones_the_advice_asks_for_and_others_simulations_answer_the_same():
    limit = direct(fcn_spec, "ddp", "none", 4, CROP, DEVICES) + 2 * MIB
    plain_stats, asked_stats, served_stats = {}, {}, {}
    plain = _advise(limit, stats=plain_stats)
    asked = Asked()
    assert _advise(limit, ahead=asked, stats=asked_stats) == plain and asked_stats["ahead"] == 0
    keys = planned_traces(STRATEGIES, DEVICES, 2 * DEVICES, CROP, POLICIES)
    assert asked.asked == keys and len(keys) == 8  # two one step beyond, three per further policy
    assert asked_stats["programs"] == plain_stats["programs"]
    best = next(row for row in plain if row.recommended)  # the confirmation's one more sample, asked meanwhile
    assert asked.asked_peaks == [(best.recompute, CROP, best.strategy, best.per_device + 1)]
    # the traces and peaks of simulators of their own (as the second process makes them) stand for the advice's own
    served = Asked(advice_peaks(fcn_spec, DEVICES, CUDA_BLOCK, "nccl", ("none", CROP)))
    assert _advise(limit, ahead=served, stats=served_stats) == plain
    assert served.taken == len(keys) + 1 and served_stats["ahead"] == served.taken
    assert served_stats["programs"] == plain_stats["programs"]  # those taken count as simulated
    assert any(row.per_device > 2 for row in plain)


def test_planned_traces_follow_the_strategies_and_policies():
    assert planned_traces(["balanced"], 4, 8, 64, ("none",)) == [("none", 72, "ddp", 3)]
    assert planned_traces(["zero1", "fsdp"], 4, 4, 64, ("none", "all")) == [
        ("none", 72, "fsdp", 3), ("all", 64, "ddp", 2), ("all", 64, "fsdp", 2)]  # two samples at least
    assert planned_traces(["balanced-auto"], 4, 8, 64) == []


SIMULATED_FIRST = """
import json, sys
from encoding.memory.advice import planned_traces
from encoding.memory.ahead import TracesAhead
from encoding.memory.tracker import CUDA_BLOCK, MIB
from test_memory_ahead import DEVICES, CROP, POLICIES, STRATEGIES, _advise, direct, fcn_spec

limit = direct(fcn_spec, "ddp", "none", 4, CROP, DEVICES) + 2 * MIB  # a simulation: autograd's device threads start
keys = planned_traces(STRATEGIES, DEVICES, 2 * DEVICES, CROP, POLICIES)
stats = {}
with TracesAhead(fcn_spec, keys, DEVICES, CUDA_BLOCK, "nccl", ("none", CROP)) as ahead:
    rows = _advise(limit, ahead=ahead, stats=stats)
json.dump({"failed": ahead.failed, "taken": ahead.taken, "ahead": stats["ahead"],
           "same": rows == _advise(limit)}, sys.stdout)
"""


def test_a_process_forked_after_a_simulation_says_so_and_the_advice_simulates_everything(monkeypatch):
    """In a fresh interpreter that simulated a step first, autograd refuses backward passes in a fork: the second
    process says so at once, and the advice simulates what it asks for itself (the same answers)."""
    if not FORKS:
        pytest.skip("no second process here (Linux with two CPUs)")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", SIMULATED_FIRST], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert "autograd" in result["failed"] and result["taken"] == result["ahead"] == 0 and result["same"]
    # and where no process can be forked, none is
    monkeypatch.setattr(ahead_module, "can_fork", lambda: False)
    assert ahead_module.traces_ahead(fcn_spec, STRATEGIES, DEVICES, 2 * DEVICES, CROP, CUDA_BLOCK, "nccl", POLICIES,
                                     "none") is None


def test_the_command_line_traces_ahead_in_a_second_process_and_answers_the_same(tmp_path):
    """``python -m encoding.memory --advise`` in a fresh interpreter (no backward run yet) takes the planned traces
    from its second process; its rows are the ones this process computes alone."""
    if not FORKS:
        pytest.skip("no second process here (Linux with two CPUs)")
    argv = ["--model", "fcn", "--backbone", "vgg_tiny", "--nclass", "6", "--crop-size", str(CROP), "--simulate",
            str(DEVICES), "--batch-size", str(2 * DEVICES), "--strategies", ",".join(STRATEGIES), "--advise",
            "--memory-limit", "40MiB", "--reserve", "0B"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "encoding.memory", *argv, "--out-dir", str(tmp_path / "ahead")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "9 of them ahead, in a second process" in run.stderr  # the progress lines: 8 traces, 1 peak
    from encoding.memory.cli import parse_args
    from encoding.memory.report import memory_report

    alone = memory_report(parse_args(argv + ["--out-dir", str(tmp_path / "alone")]), progress=False)
    forked = json.loads((tmp_path / "ahead" / "memory_balance.json").read_text())
    assert forked["advice"] == alone["advice"] and any(r["recommended"] for r in alone["advice"])
