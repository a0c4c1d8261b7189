"""The simulator's shortcuts give the peaks of the programs they stand for: fsdp's ranks composed from one rank's
forward and backward and each rank's own rest (the optimizer step of its shards, on rank 0's sharded model viewed
as its own) equal every rank simulated whole, and a model whose backward leaves other gradients than the composition
assumes is simulated whole."""
import pytest

from encoding.memory import Simulator, segmentation_spec
from encoding.memory import simulate
from encoding.memory.program import device_programs
from encoding.memory.tracker import CUDA_BLOCK
from test_memory_plan import ShardNet, UnusedParameter, shard_spec


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
    assert len(simulator.sharded) == 1  # the other ranks' rests run on rank 0's model, viewed as theirs
    if devices > 16:
        assert len(set(peaks)) > 1  # the shards differ: the ranks' own rests are what tells them apart


def test_fsdp_ranks_of_a_zoo_network_composed_equal_ranks_simulated_whole():
    spec = segmentation_spec("fcn", "resnet18", 5, 32, aux=True)
    simulator = Simulator(spec, CUDA_BLOCK)
    split = [2] * 24
    assert simulator.peaks("fsdp", split) == _whole(spec, split)
    assert simulator.programs_run == 1 and simulator.rests_run > 1 and len(simulator.sharded) == 1


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


# --------------------------------------------------------------------- the advice's further policies: no new sharding
def _fcn(crop, policy):
    return segmentation_spec("fcn", "vgg_tiny", 5, crop, aux=True, recompute=policy)


@pytest.mark.parametrize("policy", ["backbone", "all"])
def test_a_further_policy_runs_on_the_first_policys_models_and_optimizers_event_for_event(policy):
    """The model built (and sharded) without recomputation, its blocks (and heads) switched to recomputing while a
    program runs, stepping the optimizers warmed on it, records the very events of the model built with the policy,
    sharded and warmed up on its own: every strategy."""
    base = Simulator(_fcn(32, "none"), CUDA_BLOCK)
    for strategy in ("gather", "ddp", "fsdp", "zero1"):
        base.peaks(strategy, [2] * 4)
    viewed = Simulator(_fcn(32, policy), CUDA_BLOCK, base.fake_mode, sharded_from=base)
    own = Simulator(_fcn(32, policy), CUDA_BLOCK)
    for strategy in ("gather", "balanced", "ddp", "fsdp", "zero1"):
        for program in device_programs(strategy, [2] * 4)[:2] + device_programs(strategy, [3] * 4)[:1]:
            assert viewed.result(program, record=True).trace == own.result(program, record=True).trace, program
    assert viewed.peaks("fsdp", [2] * 7) == own.peaks("fsdp", [2] * 7)
    assert viewed.sharded == {} and set(base.sharded) == set(own.sharded) == {(4, 0), (7, 0)}
    assert viewed.optimizers == {} and own.optimizers  # nothing warmed up of its own
    modules = list(base.model.modules()) + list(base.sharded_model(4, 0).modules())
    assert not any(simulate.is_checkpointed(m) for m in modules)  # switched back


def test_recompute_view_names_the_recomputed_modules_and_nothing_else():
    none, backbone = (_fcn(32, p).build_model() for p in ("none", "backbone"))
    names = simulate.recompute_view(none, backbone)
    assert names and all(name.startswith("backbone.") for name in names)
    assert simulate.recompute_view(none, _fcn(32, "none").build_model()) == []
    # a plain attribute (BatchNorm's momentum) or a parameter that differs: not a view, the policy shards its own
    assert simulate.recompute_view(ShardNet(momentum=0.1), ShardNet(momentum=0.2)) is None
    assert simulate.recompute_view(ShardNet(width=16), ShardNet(width=8)) is None


def test_the_advice_answers_the_same_without_the_shared_sharded_model(monkeypatch, devices=3):
    """Every policy sharding its own model (the advice before) gives the same rows, all strategies and policies."""
    from encoding.memory.advice import advise
    from encoding.memory.tracker import MIB

    limit = max(Simulator(_fcn(32, "none"), CUDA_BLOCK).peaks("ddp", [4] * devices)) + 2 * MIB
    strategies = ["gather", "balanced", "ddp", "fsdp", "zero1"]
    fast = advise(_fcn, strategies, devices, 2 * devices, 32, limit, CUDA_BLOCK)
    monkeypatch.setattr(simulate, "recompute_view", lambda base, other: None)
    slow = advise(_fcn, strategies, devices, 2 * devices, 32, limit, CUDA_BLOCK)
    assert fast == slow and any(row.per_device > 2 for row in fast)
    assert {row.recompute for row in fast} == {"none", "backbone", "all"}
