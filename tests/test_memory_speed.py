"""The simulator's shortcuts give the peaks of the programs they stand for: fsdp's ranks composed from one rank's
forward and backward and each rank's own rest (the optimizer step of its shards) equal every rank simulated whole,
and a model whose backward leaves other gradients than the composition assumes is simulated whole."""
import pytest
import torch
from torch import nn

from encoding.memory import Simulator, segmentation_spec
from encoding.memory import simulate
from encoding.memory.program import device_programs
from encoding.memory.tracker import CUDA_BLOCK
from test_memory_plan import ShardNet, shard_spec


def _whole(spec, split, backend="nccl"):
    """Every fsdp rank of ``split`` simulated whole (the simulator without the composition), in rank order."""
    reference = Simulator(spec, CUDA_BLOCK, backend=backend)
    return [reference.result(program, record=True).peak for program in device_programs("fsdp", split)]


@pytest.mark.parametrize("devices", [3, 16, 40])
@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_fsdp_ranks_composed_equal_ranks_simulated_whole(devices, backend):
    """ShardNet's 16-channel convolutions over 16 and 40 ranks: ranks with shorter and empty shards, each kind its
    own optimizer state; one rank simulated whole, the others' rests alone."""
    spec = shard_spec()
    simulator = Simulator(spec, CUDA_BLOCK, backend=backend)
    split = [2] * devices
    peaks = simulator.peaks("fsdp", split)
    assert peaks == _whole(spec, split, backend)
    kinds = len({simulator.representative(p) for p in device_programs("fsdp", split)})
    assert simulator.programs_run == 1 and simulator.rests_run == (kinds if kinds > 1 else 0)
    if devices > 16:
        assert len(set(peaks)) > 1  # the shards differ: the ranks' own rests are what tells them apart


def test_fsdp_ranks_of_a_zoo_network_composed_equal_ranks_simulated_whole():
    spec = segmentation_spec("fcn", "resnet18", 5, 32, aux=True)
    simulator = Simulator(spec, CUDA_BLOCK)
    split = [2] * 24
    assert simulator.peaks("fsdp", split) == _whole(spec, split)
    assert simulator.programs_run == 1 and simulator.rests_run > 1


class UnusedParameter(ShardNet):
    """A parameter forward never uses: FSDP reduce-scatters no gradient for it, which the rest alone would hold."""

    def __init__(self):
        super().__init__()
        self.unused = nn.Parameter(torch.zeros(4096))


def test_fsdp_ranks_are_simulated_whole_where_composing_is_not_exact():
    spec = shard_spec()
    spec = type(spec)(**{**spec.__dict__, "build_model": UnusedParameter})
    simulator = Simulator(spec, CUDA_BLOCK)
    split = [2] * 40
    peaks = simulator.peaks("fsdp", split)
    assert peaks == _whole(spec, split)
    kinds = len({simulator.representative(p) for p in device_programs("fsdp", split)})
    assert kinds > 1 and simulator.rests_run == 1 and simulator.programs_run == kinds


def test_without_the_composition_every_fsdp_rank_kind_is_simulated_whole(monkeypatch):
    """The switch the benchmark's baseline uses (``bench_memory.py scale --baseline``)."""
    monkeypatch.setattr(simulate, "_COMPOSED_RANKS", ("zero1",))
    simulator = Simulator(shard_spec(), CUDA_BLOCK)
    simulator.peaks("fsdp", [2] * 40)
    assert simulator.rests_run == 0 and simulator.programs_run > 1
