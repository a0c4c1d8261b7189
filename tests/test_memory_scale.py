"""Planning at cluster scale: identical ranks simulated once (and zero1's ranks composed) give every device the
peak of its own simulation; the shards of 1024 ranks without 1024 chunks; the table and chart past 32 devices."""
import pytest
import torch

from encoding.memory import Simulator, simulate_program, strategy_peaks
from encoding.memory import optimizers
from encoding.memory.program import device_programs
from encoding.memory.report import MAX_BARS, device_ranges, format_report
from encoding.memory.sharded import chunk_views, zero_optimizer
from encoding.memory.tracker import CUDA_BLOCK
from test_memory_plan import UnusedParameter, shard_spec


def _per_rank(spec, strategy, split, monkeypatch):
    """Every device simulated on its own: its own fake model, sharded by torch's own chunking, a full warm-up
    step, and for zero1 torch's ZeroRedundancyOptimizer itself."""
    with monkeypatch.context() as patch:
        patch.setattr(optimizers, "PartitionOptimizer", lambda params, make: zero_optimizer(params, make))
        return [simulate_program(spec, program, CUDA_BLOCK).peak for program in device_programs(strategy, split)]


@pytest.mark.parametrize("strategy", ["gather", "balanced", "balanced-auto", "ddp", "fsdp", "zero1"])
@pytest.mark.parametrize("devices", [3, 16])
def test_identical_rank_simulation_equals_per_rank_simulation(strategy, devices, monkeypatch):
    """16 ranks of a 12-parameter net: zero1 partitions of different sizes and empty ones, fsdp shards with empty
    chunks; gather's device 0 differs from the others (decided from the program, not assumed)."""
    spec = shard_spec()
    simulator = Simulator(spec, CUDA_BLOCK)
    split, peaks = strategy_peaks(simulator, strategy, 2 * devices + 1, devices)
    assert peaks == _per_rank(spec, strategy, split, monkeypatch)
    distinct = {p.canonical() for p in device_programs(strategy, split)}
    if strategy != "balanced-auto":  # (which simulates the programs of the splits it weighs)
        assert simulator.programs_run <= len(distinct)  # zero1: one whole rank, the others' rests alone
    if strategy == "gather":
        assert peaks[0] > peaks[1] == peaks[-1]
    if strategy == "fsdp":  # torch.chunk's first chunk is the longest: the advice plans with rank 0
        assert peaks[0] == max(peaks) and (devices < 16 or peaks[-1] < peaks[0])


def test_zero1_ranks_are_simulated_whole_where_composing_is_not_exact():
    spec = shard_spec()
    spec = type(spec)(**{**spec.__dict__, "build_model": UnusedParameter})
    simulator = Simulator(spec, CUDA_BLOCK)
    peaks = simulator.peaks("zero1", [2] * 5)
    # each rank the first of a simulator of its own: simulated whole
    assert peaks == [Simulator(spec, CUDA_BLOCK).peak(p) for p in device_programs("zero1", [2] * 5)]
    assert simulator.rests_run == 1 and simulator.programs_run == len(set(simulator.zero_partitions(5)))


@pytest.mark.parametrize("size", [0, 1, 5, 7, 64, 161])
@pytest.mark.parametrize("count", [1, 3, 8, 1024])
def test_chunk_views_are_torch_chunk_padded(size, count):
    tensor = torch.arange(2 * size, dtype=torch.float32).reshape(size, 2)
    expected = list(torch.chunk(tensor, count, dim=0))
    expected += [expected[0].new_empty(0)] * (count - len(expected))
    views = chunk_views(tensor, count, 0)
    assert len(views) == count
    for index in {0, 1 % count, count // 2, count - 1}:
        got, want = views[index], expected[index]
        assert (got.shape, got.stride()) == (want.shape, want.stride())
        assert torch.equal(got, want) and (not want.numel() or got.storage_offset() == want.storage_offset())


def _report(devices):
    peaks = [3000.0] * devices
    peaks[0], peaks[devices // 2] = 3100.0, 3100.0
    config = {"model": "fcn", "backbone": "resnet50", "dataset": "ade20k", "nclass": 150,
              "batch_size": 2 * devices, "crop_size": 480, "aux": True, "se_loss": False, "amp": None,
              "calibrate": False, "memory_limit": None, "memory_limit_mib": None, "recompute": "none",
              "mode": "simulated", "devices": devices, "strategies": ["ddp", "zero1"]}
    return {"config": config, "strategies": {
        "ddp": {"peak_mib": [3200.0] * devices, "split": [2] * devices, "max_over_mean": 1.0, "max_over_min": 1.0},
        "zero1": {"peak_mib": peaks, "split": [2] * devices, "max_over_mean": 1.03, "max_over_min": 1.03}}}


def test_table_past_32_devices_is_a_summary():
    table = format_report(_report(1024))
    lines = table.splitlines()
    assert len(lines) < 15 and max(map(len, lines)) < 120, table
    rows = {line.split()[0]: line for line in lines if line.strip()}
    assert rows["min"].split()[1:] == ["3200.0", "(2)", "3000.0", "(2)"]
    assert rows["max"].split()[1:] == ["3200.0", "(2)", "3100.0", "(2)"]
    assert rows["devices"].split()[-2:] == ["0-1023", "0,512"], table
    assert len(format_report(_report(MAX_BARS)).splitlines()) > MAX_BARS  # up to 32: one row per device


def test_device_ranges():
    assert device_ranges([0, 1, 2, 3]) == "0-3"
    assert device_ranges([0, 2, 3, 7, 9]) == "0,2-3,… (5)"


def test_chart_past_32_devices_draws_min_median_max_and_names_the_devices_at_the_max():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from encoding.memory.report import chart_figure

    fig = chart_figure(_report(1024))
    try:
        ax = fig.axes[0]
        assert len(ax.patches) == 6  # 2 strategies x min / median / max
        assert sorted(p.get_height() for p in ax.patches) == [3000.0, 3000.0, 3100.0, 3200.0, 3200.0, 3200.0]
        assert {t.get_text() for t in ax.texts} == {"devices 0-1023", "devices 0,512"}
    finally:
        plt.close(fig)
