"""The advice's replays (issue 36, item 1): a device program's allocation events recorded at two points replayed at
any share and crop give exactly the simulated peak there, steps whose sizes are no monomials are refused (and
simulated), and the fast advice answers what simulating every point answers."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from encoding.memory import Simulator, StepSpec, segmentation_spec
from encoding.memory.advice import _Peaks, advise, heaviest_program
from encoding.memory.replay import compose, fit, head, refit, rest_is_constant
from encoding.memory.tracker import CUDA_BLOCK, MIB
from encoding.nn import SegmentationLosses

NCLASS = 6
STRATEGIES = ["gather", "balanced", "ddp", "fsdp", "zero1"]


def fcn_spec(crop, policy):
    return segmentation_spec("fcn", "vgg_tiny", NCLASS, crop, aux=True,
                             recompute=policy)


#: the direct simulations' own simulators, one per (spec, crop, policy), shared by this module's tests (a simulator
#: steps one warmed optimizer per model and caches each program's peak): none is ever handed to the advice
_DIRECT = {}


def direct(spec_for, strategy, policy, share, crop, devices):
    """The heaviest device's peak by a simulation of its own (nothing shared with the advice)."""
    key = (spec_for, crop, policy)
    if key not in _DIRECT:
        _DIRECT[key] = Simulator(spec_for(crop, policy), CUDA_BLOCK)
    return max(_DIRECT[key].peaks(strategy, [share] * devices))


@pytest.mark.parametrize("policy", ["none", "all"])
def test_replays_give_the_simulated_peak_at_other_points(policy):
    """Fitted at (2, 32) and (3, 40), each strategy's replay equals a direct simulation at points it never saw:
    more samples, larger and smaller crops (also crops that are no multiple of 32)."""
    peaks = _Peaks(fcn_spec, 3, CUDA_BLOCK, origin=(2, 32))
    for strategy in STRATEGIES:
        replay = peaks.replay(policy, strategy)
        assert replay is not None, strategy
        for share, crop in [(5, 48), (2, 24), (7, 64)]:
            assert replay.peak(share, crop) == direct(fcn_spec, strategy, policy, share, crop, 3), \
                (strategy, share, crop)


@pytest.mark.parametrize("refits", [True, False], ids=["sizes-known", "sizes-ambiguous"])
def test_a_further_policy_replays_its_forward_and_backward_with_the_first_policys_rest(refits, monkeypatch):
    """Under a further policy only the forward and backward of ``gather``, ``ddp`` and ``fsdp`` are traced (the rest,
    the same parameters and optimizer, is the first policy's; ``balanced`` and ``zero1`` composed from ``ddp``);
    where the sizes known do not tell theirs (``sizes-ambiguous``: as for EncNet, whose per-sample 256 bytes at
    share 2 are also a constant's), at a second point too. Every replay equals a direct simulation of the policy at
    points it never saw."""
    from encoding.memory import advice

    peaks = _Peaks(fcn_spec, 3, CUDA_BLOCK, origin=(2, 32))
    for strategy in STRATEGIES:
        assert peaks.replay("none", strategy) is not None, strategy
    if not refits:
        monkeypatch.setattr(advice, "refit", lambda *args: None)
    for strategy in STRATEGIES:
        replay = peaks.replay("all", strategy)
        for share, crop in [(5, 48), (2, 24), (7, 64)]:
            assert replay.peak(share, crop) == direct(fcn_spec, strategy, "all", share, crop, 3), \
                (strategy, share, crop)
    further, beyond = peaks.simulator("all", 32), peaks._simulators.get(("all", 40))
    assert further.heads_run == further.programs_run == 3  # gather, ddp, fsdp: no whole step
    assert (beyond is None) if refits else (beyond.heads_run == beyond.programs_run == 3)


def test_a_step_traced_without_its_rest_is_the_whole_step_up_to_its_mark():
    """``Simulator.forward_backward``: the whole step's events up to the mark, then only its gradients dropped; the
    model is left as the whole step leaves it (the whole step simulated again records the same events)."""
    sim = Simulator(fcn_spec(32, "none"), CUDA_BLOCK)
    for strategy in STRATEGIES:
        program = heaviest_program(sim, strategy, 2, 3)
        whole = sim.result(program, record=True).trace
        head = sim.forward_backward(program)
        end = whole[1].index(("m",))
        assert head[0] == whole[0] and head[1][:end + 1] == whole[1][:end + 1], strategy
        assert head[1][end + 1:] and all(event[0] == "f" for event in head[1][end + 1:]), strategy
        assert sim._simulate(sim.representative(program), record=True).trace == whole, strategy


def test_the_heaviest_zero1_rank_is_the_one_holding_the_most_allocated_bytes():
    """A ``zero1`` rank owning fewer parameter elements in more tensors holds more once every tensor is rounded up
    to the allocator's blocks: the advice's heaviest rank is the one whose simulated peak is the largest."""
    sim = Simulator(fcn_spec(32, "none"), CUDA_BLOCK)
    peaks = sim.peaks("zero1", [2] * 3)
    elements = [sum(p) for p in sim.zero_partitions(3)]
    assert peaks[elements.index(max(elements))] < max(peaks)  # the case this guards: most elements, not heaviest
    assert sim.peak(heaviest_program(sim, "zero1", 2, 3)) == max(peaks)


class CoarseNet(nn.Module):
    """Features at stride 32 (``ceil(crop / 32)``): a size that is no monomial of the crop between 32 and 40."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=32, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.classifier = nn.Conv2d(8, NCLASS, 1)

    def forward(self, x):
        return F.interpolate(self.classifier(self.backbone(x)), size=x.shape[-2:], mode="bilinear")


def coarse_spec(crop, policy="none"):
    return StepSpec(build_model=CoarseNet, make_inputs=lambda b: ((torch.randn(b, 3, crop, crop),), {}),
                    make_target=lambda b: torch.randint(0, NCLASS, (b, crop, crop)),
                    criterion=SegmentationLosses(nclass=NCLASS))


def test_a_step_whose_sizes_are_no_monomials_is_not_replayed_and_the_advice_simulates():
    peaks = _Peaks(coarse_spec, 2, CUDA_BLOCK, origin=(2, 32))
    assert peaks.replay("none", "ddp") is None
    limit = direct(coarse_spec, "ddp", "none", 3, 64, 2) + 4096
    fast = advise(coarse_spec, ["ddp", "balanced"], 2, 4, 32, limit, CUDA_BLOCK, policies=("none",))
    slow = advise(coarse_spec, ["ddp", "balanced"], 2, 4, 32, limit, CUDA_BLOCK, policies=("none",), replay=False)
    assert fast == slow
    for row in fast:
        assert direct(coarse_spec, row.strategy, "none", row.per_device, 32, 2) <= limit
        assert direct(coarse_spec, row.strategy, "none", row.per_device + 1, 32, 2) > limit


def test_fast_advice_answers_what_simulating_every_point_answers(devices=3):
    limit = direct(fcn_spec, "ddp", "none", 4, 32, devices) + 2 * MIB
    kwargs = dict(policies=("none", "backbone"), stats={})
    fast = advise(fcn_spec, STRATEGIES, devices, 2 * devices, 32, limit, CUDA_BLOCK, **kwargs)
    programs = kwargs["stats"]["programs"]
    slow = advise(fcn_spec, STRATEGIES, devices, 2 * devices, 32, limit, CUDA_BLOCK, replay=False, **kwargs)
    assert fast == slow and any(row.per_device > 2 for row in fast)
    assert programs < kwargs["stats"]["programs"]  # the replays simulate fewer programs


def test_fit_refuses_different_events_and_replays_the_tracker_arithmetic():
    p1, p2 = (2, 32), (3, 40)
    image = lambda share, crop: 4 * share * crop * crop  # noqa: E731
    one = (100, [("a", image(*p1)), ("a", 24), ("f", 0), ("m",), ("a", 8), ("f", 4)])
    two = (100, [("a", image(*p2)), ("a", 24), ("f", 0), ("m",), ("a", 8), ("f", 4)])
    replay = fit(one, two, p1, p2, round_to=512)
    rounded = -(-image(5, 48) // 512) * 512
    assert replay.peak(5, 48) == 100 + rounded + 512
    assert fit(one, (100, two[1][:2] + [("f", 1)] + two[1][3:]), p1, p2, 512) is None  # another storage freed
    assert fit(one, (100, [("a", image(*p2) + 1)] + two[1][1:]), p1, p2, 512) is None  # no monomial
    assert fit(one, (101, two[1]), p1, p2, 512) is None  # another starting level
    assert refit(one, {image(*p1): {(image(*p1) / 8, 1, 2)}}, 512) is None  # 24 bytes: not a known size
    with pytest.raises(ValueError):
        fit((0, [("a", 4)]), (0, [("a", 5)]), p1, p2, 1).peak(5, 44)  # crop / 8 bytes: none at crop 44


def test_compose_needs_the_same_forward_and_backward():
    p1, p2 = (2, 32), (3, 40)
    line = fit((10, [("a", 64), ("a", 8), ("f", 0), ("m",), ("f", 1)]),
               (10, [("a", 96), ("a", 8), ("f", 0), ("m",), ("f", 1)]), p1, p2, 1)
    reference = (10, [("a", 64), ("a", 8), ("f", 0), ("m",), ("f", 1)])
    own = (30, [("a", 64), ("a", 8), ("f", 0), ("m",), ("a", 8), ("f", 1), ("f", 4)])
    composed = compose(line, own, reference)
    assert composed.peak(5, 32) == 30 + 160 + 8 and composed.peak(2, 32) == 30 + 64 + 8
    other = (30, [("a", 64), ("a", 16), ("f", 0), ("m",), ("f", 1)])
    assert compose(line, other, reference) is None


def test_a_rest_stands_for_another_steps_only_where_nothing_held_at_the_mark_grows():
    p1, p2 = (2, 32), (3, 40)
    held = fit((10, [("a", 64), ("a", 8), ("m",), ("f", 0), ("f", 1)]),
               (10, [("a", 96), ("a", 8), ("m",), ("f", 0), ("f", 1)]), p1, p2, 1)
    assert not rest_is_constant(held)  # 32 bytes per sample still live when forward and backward are done
    freed = fit((10, [("a", 64), ("f", 0), ("a", 8), ("m",), ("f", 2)]),
                (10, [("a", 96), ("f", 0), ("a", 8), ("m",), ("f", 2)]), p1, p2, 1)
    assert rest_is_constant(freed)
    assert head((10, freed.events)) == (10, freed.events[:4])


def test_the_recommended_batch_is_confirmed_by_simulation_and_a_wrong_replay_is_corrected(monkeypatch):
    """The advice's recommendation never rests on a replay alone: a replay that underestimates (forced here) is
    caught by the direct simulation of the recommended row, searched again, and said in a warning."""
    from encoding.memory import replay as replay_module

    devices = 2
    limit = direct(fcn_spec, "ddp", "none", 4, 32, devices) + 2 * MIB
    kwargs = dict(policies=("none",))
    slow = advise(fcn_spec, ["ddp"], devices, 2 * devices, 32, limit, CUDA_BLOCK, replay=False, **kwargs)
    true_peak = replay_module.Replay.peak
    monkeypatch.setattr(replay_module.Replay, "peak", lambda self, share, crop: true_peak(self, share, crop) // 2)
    with pytest.warns(RuntimeWarning, match="not confirmed by simulation"):
        fast = advise(fcn_spec, ["ddp"], devices, 2 * devices, 32, limit, CUDA_BLOCK, **kwargs)
    assert fast[0].recommended and fast[0].per_device == slow[0].per_device > 2
    assert direct(fcn_spec, "ddp", "none", fast[0].per_device, 32, devices) <= limit
    assert direct(fcn_spec, "ddp", "none", fast[0].per_device + 1, 32, devices) > limit


@pytest.mark.parametrize("policy", ["none", "all"])
def test_programs_sharing_a_warmed_optimizer_peak_as_programs_that_warm_up_their_own(policy, monkeypatch):
    """A simulator steps one warmed optimizer per model (its state counted) instead of a warm-up step per program:
    every strategy's peaks are those of programs that build and warm up their own."""
    import encoding.memory.program as program  # it calls optimizer_key by this name

    def peaks():
        sim = Simulator(fcn_spec(64, policy), CUDA_BLOCK)
        return [sim.peaks(strategy, split) for strategy in ("gather", "balanced", "ddp", "fsdp", "zero1")
                for split in ([2, 2, 1], [3, 1, 1])], sim.optimizers

    shared, optimizers = peaks()
    assert {key[0] for key in optimizers} == {"module", "fsdp", "zero1"}  # zero1: one per partition
    monkeypatch.setattr(program, "optimizer_key", lambda p: None)
    own, none = peaks()
    assert shared == own and not none


def test_the_advice_replays_the_programs_of_the_report_simulator_and_answers_the_same(devices=3):
    """The tool's table simulated the strategies at the advice's crop and share (recorded): the advice uses that
    simulator's model and programs, simulates fewer programs and answers what an advice of its own answers."""
    limit = direct(fcn_spec, "ddp", "none", 4, 32, devices) + 2 * MIB
    own_stats, reused_stats = {}, {}
    own = advise(fcn_spec, STRATEGIES, devices, 2 * devices, 32, limit, CUDA_BLOCK, policies=("none",),
                 stats=own_stats)
    table = Simulator(fcn_spec(32, "none"), CUDA_BLOCK, record=True)
    for strategy in STRATEGIES:
        table.peaks(strategy, [2] * devices)
    ran = table.programs_run
    reused = advise(fcn_spec, STRATEGIES, devices, 2 * devices, 32, limit, CUDA_BLOCK, policies=("none",),
                    stats=reused_stats, simulator=("none", table))
    assert reused == own and any(row.per_device > 2 for row in own)
    assert table.programs_run - ran <= reused_stats["programs"] < own_stats["programs"]
    # a simulator of another granularity (or with workspaces) is not used
    other = Simulator(fcn_spec(32, "none"), 1, record=True)
    advise(fcn_spec, STRATEGIES, devices, 2 * devices, 32, limit, CUDA_BLOCK, policies=("none",),
           simulator=("none", other))
    assert other.programs_run == 0
