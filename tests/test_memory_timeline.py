"""The memory timeline of one training step (issue 46, items 1 and 2): drawn from the simulation that gives the
reported peak, its kinds adding up to the total at every event, and the same step on real CPU allocations agreeing
event for event."""
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from encoding.memory import Simulator, StepSpec, simulate_program, timeline
from encoding.memory.balance import strategy_peaks
from encoding.memory.program import device_programs
from encoding.memory.timeline import KINDS, program_timeline
from encoding.memory.tracker import CUDA_BLOCK, rounded

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 5, 1))


def _spec():
    return StepSpec(_build, lambda n: ((torch.randn(n, 3, 16, 16),), {}),
                    lambda n: torch.randint(0, 5, (n, 16, 16)), nn.CrossEntropyLoss())


def _replayed_levels(start, events, round_to):
    """Bytes live after every memory event of a recorded step, by the tracker's arithmetic (independent of the
    timeline's code)."""
    levels, live, sizes = [], start, {}
    for index, event in enumerate(events):
        if event[0] == "a":
            sizes[index] = rounded(event[1], round_to)
            live += sizes[index]
        elif event[0] == "f":
            live -= sizes.pop(event[1])
        elif event[0] != "m":
            raise AssertionError(f"unexpected event {event}")
        if event[0] != "m":
            levels.append(live)
    return levels


@pytest.mark.parametrize("strategy", ["gather", "balanced", "ddp"])
def test_every_event_adds_up_and_the_peak_is_the_simulators(strategy):
    spec, split = _spec(), [2, 1]
    labelled = Simulator(spec, CUDA_BLOCK)
    for program in device_programs(strategy, split):
        line = program_timeline(labelled, program)
        plain = simulate_program(spec, program, CUDA_BLOCK, record=True)  # another simulation, no labeller
        stacks, totals = line.stacks(), line.totals()
        assert set(stacks) == set(KINDS)
        assert all(sum(stacks[k][i] for k in KINDS) == totals[i] for i in range(len(totals)))
        assert totals == _replayed_levels(*plain.trace, CUDA_BLOCK)  # the same step, event for event
        assert max(totals) == line.peak == plain.peak == labelled.peak(program)
        assert totals[line.peak_event] == line.peak and all(t < line.peak for t in totals[:line.peak_event])
        assert all(v >= 0 for k in KINDS for v in stacks[k])


def test_the_kinds_are_what_each_device_holds():
    spec = _spec()
    params = sum(rounded(p.numel() * 4, CUDA_BLOCK) for p in _build().parameters())
    buffers = sum(rounded(b.numel() * b.element_size(), CUDA_BLOCK) for b in _build().buffers())
    simulator = Simulator(spec, CUDA_BLOCK)
    gather0, gather1 = (program_timeline(simulator, p) for p in device_programs("gather", [2, 2]))
    ddp = program_timeline(simulator, device_programs("ddp", [2, 2])[0])
    assert gather0.start["parameters"] == params + buffers and gather0.start["optimizer"] == params  # momentum
    assert gather1.start == dict.fromkeys(KINDS, 0) | {"parameters": params + buffers}  # a replica
    flat = rounded(sum(p.numel() for p in _build().parameters()) * 4, CUDA_BLOCK)
    assert ddp.start["communication"] == flat  # DDP's gradient bucket (one, < 1 MiB): one more copy of them
    for line in (gather0, ddp):
        phases = dict(line.phases)
        assert list(phases) == ["forward", "backward", "gradients", "optimizer"]
        mark = phases["gradients"] - 1  # the last event of backward: every gradient is there
        assert line.stacks()["gradients"][mark] == params
        assert max(line.stacks()["activations"][:phases["backward"]]) > 0
    # the whole batch's outputs gathered on device 0 (4 images x 5 classes x 16 x 16 floats) and nowhere else
    assert max(gather0.stacks()["outputs"]) >= 4 * 5 * 16 * 16 * 4
    assert max(gather0.stacks()["outputs"]) > max(gather1.stacks()["outputs"])
    # the replica receives its output's gradient chunk from device 0
    assert max(gather1.stacks()["communication"]) == rounded(2 * 5 * 16 * 16 * 4, CUDA_BLOCK)
    made = {row["made_by"] for row in gather0.largest}
    assert any(m.startswith(("0", "1", "2", "3")) for m in made), made  # named by the module (Sequential's "0")


def test_timeline_api_writes_json_png_and_a_self_contained_page(tmp_path):
    data = timeline(_spec(), batch=4, num_devices=2, strategies=("gather", "balanced"), out_dir=str(tmp_path))
    peaks = {s: strategy_peaks(Simulator(_spec(), CUDA_BLOCK), s, 4, 2)[1] for s in ("gather", "balanced")}
    assert {s: e["peak_bytes"] for s, e in data["strategies"].items()} == peaks
    assert data["strategies"]["gather"]["limiting_device"] == 0
    saved = json.loads((tmp_path / "timeline.json").read_text())
    assert saved["strategies"]["gather"]["programs"][0]["peak"] == peaks["gather"][0]
    import matplotlib.image

    image = matplotlib.image.imread(str(tmp_path / "timeline.png"))
    assert image.shape[0] > 300 and image.shape[1] > 600
    assert image[..., :3].std() > 0.05  # drawn, not blank
    page = (tmp_path / "timeline.html").read_text()
    assert "<svg" in page and "src=" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    embedded = json.loads(page.split("const P = ", 1)[1].split(";", 1)[0].replace("<\\/", "</"))
    assert embedded["data"]["strategies"]["balanced"]["peak_bytes"] == peaks["balanced"]
    assert not list(tmp_path.glob(".*tmp*"))


def test_the_tool_writes_the_timeline_of_its_own_simulation(tmp_path):
    from encoding.memory import main

    out = tmp_path / "t"
    report = main(["--model", "fcn", "--backbone", "resnet50", "--dataset", "pascal_voc", "--simulate", "2",
                   "--batch-size", "3", "--crop-size", "32", "--strategies", "balanced", "--out-dir",
                   str(tmp_path), "--timeline", str(out)])
    data = json.loads((out / "timeline.json").read_text())
    peaks = data["strategies"]["balanced"]["peak_bytes"]
    assert [round(p / 2 ** 20, 2) for p in peaks] == report["strategies"]["balanced"]["peak_mib"]
    assert data["strategies"]["balanced"]["split"] == report["strategies"]["balanced"]["split"]
    assert (out / "timeline.png").stat().st_size > 10000 and (out / "timeline.html").exists()


@pytest.mark.parametrize("extra, message", [(["--calibrate"], "--calibrate"), (["--timeline", __file__], "a file"),
                                            (["--timeline", "/proc/timeline"], "cannot write")])
def test_the_tool_refuses_what_the_timeline_cannot_draw(tmp_path, extra, message, capsys):
    from encoding.memory.cli import cli

    argv = ["--model", "fcn", "--backbone", "resnet50", "--simulate", "2", "--out-dir", str(tmp_path),
            "--timeline", str(tmp_path / "t")] + extra
    status, err = cli(argv), capsys.readouterr().err
    assert status == 2, err[-1000:]
    assert message in err and "--timeline" in err and "Traceback" not in err and err.count("\n") == 1, err
    assert not os.listdir(tmp_path)  # refused before any work: nothing written


#: The programs measured for real (ddp's real step runs a real DDP: gloo threads).
REAL_CASES = [("gather", True), ("gather", False), ("balanced", True), ("balanced", False)]

#: The oneDNN instruction sets the real steps run with: this CPU's, and AVX2's (a CPU without AVX-512: there a
#: convolution writes a blocked copy of its output the size of the output, reordered into it and freed inside the
#: operator; CI once ran on such a CPU).
ISAS = [None, "AVX2"]


def _measured(case):
    """The real CPU step of one of :data:`REAL_CASES` (run in a fresh process: see ``real_steps``)."""
    from encoding.memory.timeline_real import measure_timeline_cpu

    torch.set_num_threads(1)  # as conftest's one_thread fixture: a convolution keeps a buffer per thread
    strategy, source = case
    return measure_timeline_cpu(_spec(), next(p for p in device_programs(strategy, [2, 2]) if p.source == source))


@pytest.fixture(scope="module")
def real_steps():
    """Every real step of :data:`REAL_CASES` with each of :data:`ISAS`, measured in a fresh process per ISA: the
    profiler counts every thread of the process, and a thread an earlier test left running (a 4-byte scalar once)
    must not be counted."""
    import multiprocessing

    from unittest import mock

    steps = {}
    for isa in ISAS:  # the environment the spawned process starts with
        with mock.patch.dict(os.environ, {"ONEDNN_MAX_CPU_ISA": isa} if isa else {}), \
                multiprocessing.get_context("spawn").Pool(1) as pool:
            steps.update({(isa, *case): step for case, step in zip(REAL_CASES, pool.map(_measured, REAL_CASES))})
    return steps


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("strategy, source", REAL_CASES)
def test_real_cpu_allocations_agree_event_for_event(strategy, source, isa, one_thread, real_steps):
    from encoding.memory.timeline_real import compare, simulated_events

    spec = _spec()
    program = next(p for p in device_programs(strategy, [2, 2]) if p.source == source)
    start, events, peak = simulated_events(spec, program)
    result = compare(start, events, real_steps[isa, strategy, source])
    assert result["simulated_peak"] == peak, result
    assert result["tokens"] > 10 and result["matched"] == result["tokens"], result  # every storage, in order
    assert result["largest_gap"] == 0 and result["start_gap"] == 0, result  # the same bytes live after every one
    assert abs(result["error"]) < 0.01, result  # the whole peak, the kernels' own scalars and buffers included
    assert result["simulated_moment"] >= 0 and result["real_moment"] >= 0, result
    assert abs(result["moment_error"]) < 0.01, result  # at the simulated peak's moment the real step is at its peak


def test_a_kernels_buffer_of_an_outputs_size_and_a_reused_address_do_not_mislead_the_alignment():
    """A real step (CPU oneDNN without AVX-512) where a convolution's blocked copy of its output, the output's size,
    is allocated before the output and freed inside the operator, and its address is handed out again to the next
    output: the output is the allocation living as long as the simulated one, and each free is that of the real
    allocation matched (not the earlier free of the same address)."""
    from encoding.memory.timeline_real import RealStep, compare

    size = 16384
    # simulated: X (lives while Y and Z are made), Y, Y freed, Z, Z freed, X freed
    events = [("a", size), ("a", size), ("f", 1), ("a", size), ("f", 3), ("f", 0)]
    # real: the buffer at address 1, X at 2, the buffer freed, Y at 1 (the address again), Y freed, Z at 3, ...
    real = [(1, size), (2, size), (1, -size), (1, size), (1, -size), (3, size), (3, -size), (2, -size)]
    levels = [sum(n for _, n in real[:k + 1]) for k in range(len(real))]
    result = compare(0, events, RealStep(real, levels, 0))
    assert result["matched"] == result["tokens"] == 6
    assert result["largest_gap"] == 0 and result["simulated_peak"] == result["real_peak"] == 2 * size


def test_import_encoding_stays_light():
    code = ("import sys, encoding, encoding.memory; "
            "print(sorted(m for m in ('matplotlib', 'encoding.memory.timeline_draw', 'encoding.memory.timeline_real')"
            " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-1000:]
    assert done.stdout.strip() == "[]"


def _calibrated():
    """The workspaces learned from real steps of :func:`_spec` and the real step of gather's other device, both
    measured in a fresh process (see ``real_steps``: the profiler counts every thread of the process)."""
    from encoding.memory import learn_workspaces
    from encoding.memory.timeline_real import measure_timeline_cpu

    spec = _spec()
    return learn_workspaces(spec), measure_timeline_cpu(spec, device_programs("gather", [2, 2])[1])


def test_calibrated_timeline_draws_the_learned_workspaces_and_meets_the_real_peak():
    import multiprocessing

    from encoding.memory.timeline_real import compare

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        # real steps of this model: what its kernels hold beyond their outputs, and the step to compare with
        workspaces, measured = pool.apply(_calibrated)
    spec = _spec()
    simulator = Simulator(spec, workspaces=workspaces)
    program = device_programs("gather", [2, 2])[1]
    line = program_timeline(simulator, program)
    assert line.peak == max(line.totals()) == Simulator(spec, workspaces=workspaces).peak(program)
    assert line.peak > simulate_program(spec, program).peak  # the workspaces count
    spikes = [m for m in line.makers if m.endswith("workspace (learned)")]
    assert spikes and len(spikes) % 2 == 0  # each held while its operator runs: on, then off
    start, events = simulator.result(program).trace
    result = compare(start, events, measured, timeline=line)
    assert result["matched"] == result["tokens"]
    assert abs(result["error"]) < 0.01 and abs(result["moment_error"]) < 0.01
