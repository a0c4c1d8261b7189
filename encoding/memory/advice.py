"""The answer to "what fits?": per strategy and activation-checkpointing policy, the largest batch that fits a
memory limit at a crop and the largest crop that fits at a batch (:func:`advise`), and the recommended configuration.

The search does not bisect (:func:`largest_fitting`): the heaviest device's peak is the larger of a fixed level
(the optimizer step's state) and a line in its share (in ``crop ** 2`` over crops, multiples of :data:`CROP_STEP`),
so two points give the answer and a third verifies it; every answer is then confirmed at the boundary
(:func:`confirm_boundary`). The points come from replays (:mod:`~encoding.memory.replay`) of each strategy's heaviest
device program traced at the advice's share and crop and its forward and backward one sample and crop step beyond
(``fsdp`` fitted before ``ddp``, whose sizes are among its own: :data:`_FIT_ORDER`); a further checkpointing policy
traces its forward and backward alone, on the first policy's model, and takes the first policy's rest; ``balanced``
and ``zero1`` are ``ddp``'s forward and backward with their own state. Where a replay does not fit, every point is
simulated (:class:`_Peaks`: programs cached per crop and policy, ``balanced`` and ``zero1`` composed from ``ddp``
where exact). docs/memory.md tells why each step is exact.
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..nn.recompute import RECOMPUTE_POLICIES
from .balance import _even_split, strategy_peaks
from .program import MEMORY_STRATEGIES, DeviceProgram, StepSpec, device_programs
from .replay import Replay, compose, fit, head, refit, rest_is_constant, size_table
from .search import confirm_boundary, largest_fitting
from .simulate import Simulator, heaviest_program
from .tracker import Workspaces

__all__ = ["CROP_STEP", "ADVISED_STRATEGIES", "Advice", "advise", "recommend", "heaviest_program",
           "largest_fitting", "confirm_boundary", "planned_traces", "advice_peaks"]

#: Crops are searched in multiples of this many pixels (the output stride of the dilated backbones).
CROP_STEP = 8
#: The strategies :func:`advise` answers for (``balanced-auto``'s batch that fits is at least ``balanced``'s).
ADVISED_STRATEGIES = tuple(s for s in MEMORY_STRATEGIES if s != "balanced-auto")
#: Strategies whose heaviest device runs ``ddp``'s forward and backward: composed from it where exact.
_COMPOSED = ("balanced", "zero1")
#: The order the first policy's replays are fitted in: ``fsdp``'s step holds every size ``ddp``'s does (the same
#: forward, backward and loss) and its shards', so that ``ddp``'s sizes are known from it (no second point traced).
_FIT_ORDER = ("gather", "fsdp", "ddp")
#: The smallest share a replay answers for (one sample behind global pooling trains BatchNorm another way).
_MIN_REPLAYED = 2


@dataclass(frozen=True)
class Advice:
    """One row of the advice: a strategy and a checkpointing policy.

    Attributes:
        strategy: the strategy.
        recompute: ``"none"``, ``"backbone"`` or ``"all"`` (the activation-recomputation policy).
        max_batch: the largest total batch (``per_device`` samples on each device) whose heaviest device fits the
            limit at the given crop; ``0``: not even one sample per device fits.
        per_device: ``max_batch / num_devices``.
        max_crop: the largest square crop (a multiple of :data:`CROP_STEP`) that fits at the given batch; ``0``:
            none fits.
        recommended: the configuration to use (see :func:`recommend`).
    """

    strategy: str
    recompute: str
    max_batch: int
    per_device: int
    max_crop: int
    recommended: bool = False

    def as_dict(self) -> Dict[str, object]:
        """The row as JSON-ready values."""
        return {"strategy": self.strategy, "recompute": self.recompute, "max_batch": self.max_batch,
                "per_device": self.per_device, "max_crop": self.max_crop, "recommended": self.recommended}


class _Peaks:
    """Heaviest-device peaks per (policy, crop, strategy, share), each simulator built once and sharing its
    policy's fake model and sharded model; ``balanced`` and ``zero1`` composed from ``ddp`` where exact."""

    def __init__(self, spec_for: Callable[[int, str], StepSpec], num_devices: int, round_to: int,
                 backend: str = "nccl", origin: Optional[Tuple[int, int]] = None,
                 reuse: Optional[Tuple[str, int, Simulator]] = None, ahead: Any = None,
                 workspaces: Optional[Workspaces] = None) -> None:
        self.spec_for, self.num_devices, self.round_to, self.backend = spec_for, num_devices, round_to, backend
        self.workspaces = workspaces  # the kernels' buffers every simulator adds (no replay sees them)
        self.ahead = ahead  # traces simulated ahead in another process (encoding.memory.ahead.TracesAhead), or None
        self.origin = origin  # (share, crop) the replays are fitted at; None: every point simulated
        self._replays: Dict[Tuple[str, str], Optional[Replay]] = {}
        self._fits: List[Replay] = []  # the replays fitted from two traces (their sizes: size_table)
        self._own: Dict[str, Tuple[tuple, tuple]] = {}  # strategy -> (its trace, ddp's) of _composed
        self._bases: Dict[str, Tuple[str, tuple]] = {}  # strategy -> (policy, its whole step traced) of _fitted
        self._simulators: Dict[Tuple[str, int], Simulator] = {}
        self._models: Dict[str, Simulator] = {}
        # (policy, strategy) -> (bytes live at the step's start, peak of the rest of the step above it, ddp's),
        # or None where composing is not exact
        self._frames: Dict[Tuple[str, str], Optional[Tuple[int, int, int]]] = {}
        if reuse is not None:  # (policy, crop, simulator): its model, fake mode and programs simulated before
            policy, crop, sim = reuse
            if sim.round_to == round_to and sim.backend == backend and sim.workspaces is workspaces:
                self._simulators[policy, crop] = self._models[policy] = sim

    def simulator(self, policy: str, crop: int) -> Simulator:
        key = (policy, crop)
        if key not in self._simulators:
            first = self._models.get(policy)  # this policy's model, sharded models and optimizers (another crop)
            base = next(iter(self._models.values()), None)  # the first policy's
            # a further policy shards no model of its own: the first policy's, with its own recomputation switched on
            sim = Simulator(self.spec_for(crop, policy), self.round_to, base and base.fake_mode,
                            self.workspaces, first and first.model, self.backend, first and first.sharded,
                            optimizers=first and first.optimizers, sharded_from=None if base is first else base)
            self._models.setdefault(policy, sim)
            self._simulators[key] = sim
        return self._simulators[key]

    @property
    def programs_run(self) -> int:
        """Distinct device programs simulated so far."""
        return sum(sim.programs_run for sim in self._simulators.values())

    def __call__(self, policy: str, crop: int, strategy: str, share: int) -> int:
        replay = self.replay(policy, strategy) if share >= _MIN_REPLAYED else None
        if replay is not None:
            try:
                return replay.peak(share, crop)
            except ValueError:  # a size that is no whole number there: simulate
                pass
        return self.simulated(policy, crop, strategy, share)

    def replay(self, policy: str, strategy: str) -> Optional[Replay]:
        """The replay of ``strategy``'s heaviest device under ``policy`` (:mod:`~encoding.memory.replay`), fitted
        on first use from two simulations at :attr:`origin` and one sample and crop step beyond (``balanced`` and
        ``zero1``: one simulation, composed with ``ddp``'s); ``None`` where it does not fit."""
        if self.origin is None:
            return None
        key = (policy, strategy)
        if key not in self._replays:
            share, crop = max(_MIN_REPLAYED, self.origin[0]), self.origin[1]
            if strategy in _COMPOSED:
                self._replays[key] = self._composed(policy, strategy, share, crop)
            else:
                self._replays[key] = self._fitted(policy, strategy, share, crop)
        return self._replays[key]

    def _fitted(self, policy: str, strategy: str, share: int, crop: int) -> Optional[Replay]:
        """``strategy``'s replay under ``policy``: its step traced at ``(share, crop)``, its sizes those of the
        steps fitted before where they tell them (one monomial each), else fitted with its forward and backward
        traced one sample and crop step beyond. Under a further policy (``strategy`` replayed under another one
        before, whose rest holds nothing that grows with the point) only its forward and backward are traced, and
        the rest is the other policy's (the same parameters, gradients and optimizer state: checked by
        :func:`~encoding.memory.replay.compose`)."""
        origin = (share, crop)
        table = size_table(self._fits, origin)
        base = self._bases.get(strategy)
        if base is not None and base[0] != policy:
            start = self.trace(policy, crop, strategy, share, head=True)
            line = refit(start, table, self.round_to) or self._line(policy, strategy, start, origin)
            composed = None if line is None else compose(line, base[1], base[1])
            if composed is not None:
                return composed
        first = self.trace(policy, crop, strategy, share)
        replay = refit(first, table, self.round_to) if self._fits else None
        if replay is None:
            line = self._line(policy, strategy, first, origin)
            if line is None:  # the forward and backward are no replay: neither is the whole step
                return None
            replay = compose(line, first, first) or fit(
                first, self.trace(policy, crop + CROP_STEP, strategy, share + 1), origin,
                (share + 1, crop + CROP_STEP), self.round_to)
            if replay is not None:
                self._fits.append(replay)
        if replay is not None and rest_is_constant(replay):
            self._bases.setdefault(strategy, (policy, first))
        return replay

    def _line(self, policy: str, strategy: str, trace: Tuple[int, List[tuple]],
              origin: Tuple[int, int]) -> Optional[Replay]:
        """The forward and backward of ``trace`` (``strategy``'s step at ``origin``) fitted with its forward and
        backward traced one sample and crop step beyond (:func:`~encoding.memory.replay.head`), or ``None``."""
        beyond = (origin[0] + 1, origin[1] + CROP_STEP)
        start = head(trace)
        second = None if start is None else head(self.trace(policy, beyond[1], strategy, beyond[0], head=True))
        return None if second is None else fit(start, second, origin, beyond, self.round_to)

    def _composed(self, policy: str, strategy: str, share: int, crop: int) -> Optional[Replay]:
        """``strategy``'s replay from ``ddp``'s under ``policy`` and its own state, traced once under the first
        policy asked (the same parameters under every policy: checked by :func:`~encoding.memory.replay.compose`),
        else under this one."""
        line = self.replay(policy, "ddp")
        if line is None:
            return None
        first = self._own.get(strategy)
        if first is not None:
            composed = compose(line, *first)
            if composed is not None:
                return composed
        own = (self.trace(policy, crop, strategy, share), self.trace(policy, crop, "ddp", share))
        self._own.setdefault(strategy, own)
        return compose(line, *own)

    def trace(self, policy: str, crop: int, strategy: str, share: int, head: bool = False) -> Tuple[int, List[tuple]]:
        """The recorded step of ``strategy``'s heaviest device (``head``: its forward and backward alone; one
        simulated ahead where :attr:`ahead` has it)."""
        if head and self.ahead is not None:
            trace = self.ahead.take((policy, crop, strategy, share))
            if trace is not None:
                return trace
        sim = self.simulator(policy, crop)
        program = heaviest_program(sim, strategy, share, self.num_devices)
        return sim.forward_backward(program) if head else sim.result(program, record=True).trace

    def simulated(self, policy: str, crop: int, strategy: str, share: int) -> int:
        """The heaviest device's peak simulated (``balanced`` and ``zero1`` composed from ``ddp`` where exact)."""
        sim = self.simulator(policy, crop)
        program = heaviest_program(sim, strategy, share, self.num_devices)
        if strategy not in _COMPOSED:
            return sim.peak(program)
        if (policy, strategy) not in self._frames:
            self._frames[policy, strategy] = self._frame(sim, program, share)
        frame = self._frames[policy, strategy]
        ddp = sim.result(heaviest_program(sim, "ddp", share, self.num_devices)).phases
        if frame is None or ddp is None or ddp[2] - ddp[0] != frame[2]:  # ddp's rest of the step changed
            return sim.peak(program)
        start, rest, _ = frame
        return start + max(ddp[1] - ddp[0], rest)

    def later(self, policy: str, crop: int, strategy: str, share: int) -> Callable[[], int]:
        """:meth:`simulated` when called, asked now of :attr:`ahead`'s second process where there is one (simulated
        there while this one simulates another point; here if it does not answer)."""
        key = (policy, crop, strategy, share)
        asked = self.ahead is not None and self.ahead.ask_peak(key)

        def answer() -> int:
            value = self.ahead.peak(key) if asked else None
            return self.simulated(*key) if value is None else value
        return answer

    def _frame(self, sim: Simulator, program: DeviceProgram, share: int) -> Optional[Tuple[int, int, int]]:
        """What ``program`` holds around ``ddp``'s forward and backward, from both simulated at one point, or
        ``None`` when their forward and backward differ (composing would not be exact)."""
        own = sim.result(program).phases
        ddp = sim.result(heaviest_program(sim, "ddp", share, self.num_devices)).phases
        if own is None or ddp is None or own[1] - own[0] != ddp[1] - ddp[0]:
            return None
        return own[0], own[2] - own[0], ddp[2] - ddp[0]


def advise(spec_for: Callable[[int, str], StepSpec], strategies: Sequence[str], num_devices: int, batch: int,
           crop: int, limit_bytes: int, round_to: int = 1, policies: Sequence[str] = RECOMPUTE_POLICIES,
           stats: Optional[Dict[str, int]] = None, backend: str = "nccl", replay: bool = True,
           simulator: Optional[Tuple[str, Simulator]] = None, ahead: Any = None,
           workspaces: Optional[Workspaces] = None) -> List[Advice]:
    """Per strategy x policy, the largest batch that fits ``limit_bytes`` per device at ``crop`` and the largest
    crop that fits at ``batch``; the recommended row marked (:func:`recommend`).

    Args:
        spec_for: ``(crop, policy) -> StepSpec``: the step at a square crop with a checkpointing policy (one model
            per policy: steps of one policy must build the same model).
        strategies: from :data:`ADVISED_STRATEGIES` (others are skipped).
        num_devices: devices (ranks).
        batch: the total batch of the crop search, split as the strategies split it (evenly: the heaviest device
            holds ``ceil(batch / num_devices)`` samples; at least one per device).
        crop: the crop of the batch search.
        limit_bytes: memory per device.
        round_to: allocation granularity (512 for CUDA).
        policies: the checkpointing policies to try.
        stats: filled with ``"programs"``: the device programs simulated.
        backend: ``"nccl"`` or ``"gloo"``: what the sharded ranks' collectives hold (see
            :class:`~encoding.memory.simulate.Simulator`).
        replay: answer from replays of each step's allocation events (:mod:`~encoding.memory.replay`, the same
            peaks as simulating, checked on the simulated points); ``False``: simulate every point the searches ask.
        simulator: ``(policy, simulator)``: a simulator of ``spec_for(crop, policy)`` (with ``round_to`` and
            ``backend`` and ``workspaces``; e.g. the one the tool's report used) whose model and programs the
            advice uses instead of simulating them again (recorded programs are replayed; see
            :class:`~encoding.memory.simulate.Simulator`'s ``record``). Programs count in ``stats`` where they ran.
        ahead: the forward-and-backward traces of :func:`planned_traces` simulated in a second process while the
            caller simulated something else (:class:`~encoding.memory.ahead.TracesAhead`: ``take(key)`` returns a
            trace or ``None``); the traces it does not have are simulated here. ``stats["ahead"]``: those taken.
        workspaces: the kernels' buffers the peaks add (:class:`~encoding.memory.tracker.Workspaces`, e.g. the
            :class:`~encoding.memory.kernels.CpuKernels` of ``plan(backend="gloo")``): every point is then simulated
            with them (a replay holds the step's tensors only), ``replay`` and ``ahead`` unused.
    """
    share, replay = max(1, batch // num_devices), replay and workspaces is None
    peaks = _Peaks(spec_for, num_devices, round_to, backend, (share, crop) if replay else None,
                   None if simulator is None else (simulator[0], crop, simulator[1]), ahead, workspaces)
    before = peaks.programs_run
    if replay and policies:
        families = _families(strategies)
        for strategy in (s for s in _FIT_ORDER if s in families):
            peaks.replay(policies[0], strategy)
    rows = []
    for policy in policies:
        for strategy in (s for s in strategies if s in ADVISED_STRATEGIES):
            per_device = _max_share(peaks, policy, crop, strategy, share, limit_bytes)
            best_crop = _max_crop(peaks, policy, crop, strategy, max(1, batch), limit_bytes)
            rows.append(Advice(strategy, policy, per_device * num_devices, per_device, best_crop))
    rows = _confirmed(peaks, recommend(rows), crop, limit_bytes) if replay else recommend(rows)
    if stats is not None:
        stats["ahead"] = 0 if ahead is None else ahead.taken
        stats["programs"] = peaks.programs_run - before + stats["ahead"]
    return rows


def advice_peaks(spec_for: Callable[[int, str], StepSpec], num_devices: int, round_to: int, backend: str,
                 first: Tuple[str, int]) -> "_Peaks":
    """The heaviest devices' peaks as :func:`advise` makes them (for a second process,
    :mod:`~encoding.memory.ahead`): its ``trace(policy, crop, strategy, share, head=True)`` and ``simulated(policy,
    crop, strategy, share)`` give what the advice's own give, their simulators made in its order (``first``: the
    ``(policy, crop)`` of the simulator it reuses, whose model and optimizers the further policies run on)."""
    peaks = _Peaks(spec_for, num_devices, round_to, backend)
    peaks.simulator(*first)
    return peaks


def planned_traces(strategies: Sequence[str], num_devices: int, batch: int, crop: int,
                   policies: Sequence[str] = RECOMPUTE_POLICIES) -> List[Tuple[str, int, str, int]]:
    """The forward-and-backward traces :func:`advise` (with replays) asks for in the usual case, as ``(policy,
    crop, strategy, share)`` keys of its heaviest devices' programs, in about the order it asks: under the first
    policy, the step one sample and crop step beyond the advice's point of ``gather`` and ``fsdp`` (``ddp``'s sizes
    come from ``fsdp``'s; without ``fsdp``, its own), under every further policy the step at the point of each
    strategy family. A network whose sizes another point must tell asks for more (simulated when asked)."""
    share, families = max(_MIN_REPLAYED, batch // num_devices), _families(strategies)
    beyond = [s for s in _FIT_ORDER if s in families and not (s == "ddp" and "fsdp" in families)]
    keys = [(policies[0], crop + CROP_STEP, s, share + 1) for s in beyond] if policies else []
    return keys + [(policy, crop, s, share) for policy in policies[1:] for s in families]


def _families(strategies: Sequence[str]) -> List[str]:
    """The advised ``strategies``' replay families in order (``balanced`` and ``zero1`` replay ``ddp``'s)."""
    return list(dict.fromkeys("ddp" if s in _COMPOSED else s for s in strategies if s in ADVISED_STRATEGIES))


def _confirmed(peaks: _Peaks, rows: List[Advice], crop: int, limit: int) -> List[Advice]:
    """``rows`` whose recommended batch is confirmed by direct simulation (it fits, one more sample per device does
    not); a row whose replayed answer a simulation contradicts is searched again by simulation alone (with a
    warning: never silently wrong), and the recommendation made again."""
    for _ in range(len(rows)):
        best = next((r for r in rows if r.recommended), None)
        if best is None:
            return rows

        def peak(b: int) -> int:
            return peaks.simulated(best.recompute, crop, best.strategy, b)

        beyond = peaks.later(best.recompute, crop, best.strategy, best.per_device + 1)  # meanwhile, elsewhere
        if peak(best.per_device) <= limit < beyond():
            return rows
        warnings.warn(f"advice: the replayed batch of {best.strategy} / {best.recompute} ({best.per_device} per "
                      "device) was not confirmed by simulation; searched again by simulation", RuntimeWarning)
        found = confirm_boundary(peak, best.per_device, limit)
        rows = recommend([dataclasses.replace(r, max_batch=found * peaks.num_devices, per_device=found) if r is best
                          else r for r in rows])
    return rows


def _line_of(strategy: str) -> str:
    """Whose growth ``strategy``'s heaviest device shares: ``gather``'s its own (device 0 holds the whole batch's
    outputs), the others' (each device computes its own share's loss) ``ddp``'s."""
    return "gather" if strategy == "gather" else "ddp"


def _max_share(peaks: _Peaks, policy: str, crop: int, strategy: str, share: int, limit: int) -> int:
    def peak(b: int) -> int:
        return peaks(policy, crop, strategy, b)
    found = largest_fitting(peak, share, limit, reference=lambda b: peaks(policy, crop, _line_of(strategy), b))
    return confirm_boundary(peak, found, limit)


def _max_crop(peaks: _Peaks, policy: str, crop: int, strategy: str, batch: int, limit: int) -> int:
    """The largest crop at which ``batch``, split as ``strategy`` splits it, fits: searched on the heaviest program
    at the split's largest share (device or rank 0 holds it), and confirmed at the boundary on it where it is its
    device's own program in the split, else on the split's simulated peaks (``gather``'s device 0 gathers
    ``batch`` outputs, the heaviest ``zero1`` partition may sit on a rank of fewer samples)."""
    share, n = -(-batch // peaks.num_devices), peaks.num_devices

    def peak(c: int) -> int:
        return peaks(policy, c, strategy, share)

    def split_peak(c: int) -> int:
        return max(strategy_peaks(peaks.simulator(policy, c), strategy, batch, n)[1])
    start = max(CROP_STEP, crop // CROP_STEP * CROP_STEP)
    found = largest_fitting(peak, start, limit, CROP_STEP, lambda c: float(c * c),
                            lambda c: peaks(policy, c, _line_of(strategy), share))
    if batch % n == 0:
        return confirm_boundary(peak, found, limit, CROP_STEP)
    heaviest = heaviest_program(peaks.simulator(policy, crop), strategy, share, n)  # its device's own (ddp, fsdp)?
    own = device_programs(strategy, _even_split(batch, n))[heaviest.rank].canonical() == heaviest.canonical()
    return confirm_boundary(peak if own else split_peak, found, limit, CROP_STEP)


def recommend(rows: List[Advice]) -> List[Advice]:
    """``rows`` with the recommended one marked: the largest batch that fits; ties go to the cheaper policy
    (no recomputation, then backbone, then all), then to the larger crop, then to the earlier strategy. Nothing is
    recommended when no batch fits."""
    fitting = [r for r in rows if r.max_batch > 0]
    if not fitting:
        return list(rows)
    best = min(fitting, key=lambda r: (-r.max_batch, RECOMPUTE_POLICIES.index(r.recompute), -r.max_crop,
                                       rows.index(r)))
    return [Advice(r.strategy, r.recompute, r.max_batch, r.per_device, r.max_crop, r is best) for r in rows]
