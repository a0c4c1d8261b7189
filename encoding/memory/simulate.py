"""The simulator: peak bytes of device programs run on fake tensors (``FakeTensorMode``: shapes, dtypes and
storages, no memory allocated, no kernel run) under :class:`~encoding.memory.tracker.AllocationTracker`.

:func:`simulate_program` runs one :class:`~encoding.memory.program.DeviceProgram`; :class:`Simulator` runs each
distinct program of one :class:`~encoding.memory.program.StepSpec` once (cached) and gives the peaks per device of a
strategy and split.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from torch import nn

from ..nn.recompute import enable_checkpointing, is_checkpointed
from .fakes import build_fake_model, frozen_heap, new_fake_mode, without_constants
from .program import DeviceProgram, ProgramResult, StepSpec, device_programs, run_program
from .sharded import chunks_on_demand, rank_view, rank_world, shard_model, zero_partitions
from .tracker import AllocationTracker, Workspaces

__all__ = ["new_fake_mode", "build_fake_model", "simulate_program", "Simulator", "recompute_view",
           "heaviest_program"]

#: The strategies whose ranks are composed from one rank's forward and backward (:meth:`Simulator._rank_result`).
_COMPOSED_RANKS = ("zero1", "fsdp")


def simulate_program(spec: StepSpec, program: DeviceProgram, round_to: int = 1, fake_mode: Any = None,
                     workspaces: Optional[Workspaces] = None, model: Optional[nn.Module] = None,
                     backend: str = "nccl", record: bool = False,
                     optimizers: Optional[Dict[tuple, Any]] = None, observer: Any = None,
                     gradients_only: bool = False, forward_backward_only: bool = False) -> ProgramResult:
    """Peak bytes of ``program`` on fake CPU tensors (no memory is allocated, no kernel runs).

    Args:
        spec: the step; its callables run inside ``FakeTensorMode``.
        program: the device program.
        round_to: allocation granularity (512 for a CUDA caching allocator).
        fake_mode: the ``FakeTensorMode`` to run in (one that ``spec``'s tensors already belong to), default new.
        workspaces: kernels' workspaces learned by :func:`~encoding.memory.profiler.learn_workspaces` (default: none).
        model: a model already built by ``spec.build_model`` in ``fake_mode`` (see
            :func:`~encoding.memory.program.run_program`).
        backend: ``"nccl"`` (GPUs) or ``"gloo"`` (CPU processes): what the collectives of a sharded rank hold
            (:func:`~encoding.memory.program.run_program`).
        record: keep the measured step's events (:attr:`ProgramResult.trace`: the bytes live when it starts and
            :attr:`AllocationTracker.events <encoding.memory.tracker.AllocationTracker.record>`, a mark where its
            forward and backward end), which :mod:`encoding.memory.replay` replays at other batches and crops.
        optimizers: with ``model``: its warmed optimizers, shared by the programs run on it (see
            :func:`~encoding.memory.program.run_program`).
        observer: told what each recorded allocation is (:class:`encoding.memory.timeline.Labeler`); implies
            ``record``.
        gradients_only: the rest of the step alone (see :func:`~encoding.memory.program.run_program`).
        forward_backward_only: the step without its rest (see :func:`~encoding.memory.program.run_program`).

    :attr:`ProgramResult.phases`: the bytes live when the step starts, the peak of its forward and backward, the peak
    of the rest, and the bytes live between the two.
    """
    tracker = AllocationTracker(round_to, workspaces, (program.share, program.total))
    tracker.observer, record = observer, record or observer is not None
    start, marks = [0], []  # live when the measured step starts; peak of its forward and backward, live then

    @contextlib.contextmanager
    def window() -> Iterator[None]:
        tracker.reset_peak()
        start[0] = tracker.live
        marks.clear()
        if record:
            tracker.record()
        yield
        trace.extend(tracker.events or ())
        tracker.events = None

    trace: List[tuple] = []

    def mark() -> None:
        tracker.mark_event()
        marks.append(tracker.peak)
        marks.append(tracker.live)
        tracker.reset_peak()

    with frozen_heap(), (fake_mode or new_fake_mode()), tracker, (observer or contextlib.nullcontext()):
        seconds = run_program(spec, program, "cpu", window, track=tracker.track, model=model, backend=backend,
                              mark=mark, optimizers=optimizers, gradients_only=gradients_only,
                              forward_backward_only=forward_backward_only)
    phases = (start[0], marks[0], tracker.peak, marks[1]) if len(marks) == 2 else None
    return ProgramResult(max(marks[:1] + [tracker.peak]), seconds, phases, (start[0], trace) if record else None)


def recompute_view(base: nn.Module, other: nn.Module) -> Optional[List[str]]:
    """The modules ``other`` recomputes (checkpoints) and ``base`` does not, where that is all that differs between
    the two models: the same modules, parameters, buffers and plain attributes, and each differing class the
    recomputed subclass of ``base``'s (:func:`~encoding.nn.recompute.enable_checkpointing`). ``None`` otherwise."""
    mine, theirs = dict(base.named_modules()), dict(other.named_modules())
    if list(mine) != list(theirs) or _tensors(base) != _tensors(other):
        return None
    names = []
    for name, module in theirs.items():
        own = mine[name]
        if _plain(own) != _plain(module):
            return None
        if type(own) is not type(module):
            if not (is_checkpointed(module) and not is_checkpointed(own)
                    and type(module).__checkpoint_base__ is type(own)):
                return None
            names.append(name)
    return names


def _tensors(model: nn.Module) -> list:
    return [(name, t.shape, t.dtype, t.requires_grad) for name, t in
            list(model.named_parameters()) + list(model.named_buffers())]


def _plain(module: nn.Module) -> dict:
    """A module's attributes of plain values (flags, sizes, names: what a policy might set besides its class)."""
    return {k: v for k, v in vars(module).items() if isinstance(v, (bool, int, float, str, tuple, type(None)))}


@contextlib.contextmanager
def recomputing(model: nn.Module, names: Sequence[str]) -> Iterator[None]:
    """Inside: the modules ``names`` of ``model`` recomputed (see :func:`recompute_view`), as built so."""
    modules = dict(model.named_modules())
    classes = [(modules[name], type(modules[name])) for name in names]
    enable_checkpointing([module for module, _ in classes])
    try:
        yield
    finally:
        for module, cls in classes:
            module.__class__ = cls


class Simulator:
    """Simulated peaks of the device programs of one :class:`StepSpec`, each distinct program run once.

    Args:
        spec: the step.
        round_to: allocation granularity (512 for CUDA).
        fake_mode: as for :func:`simulate_program`.
        workspaces: kernels' workspaces (see :func:`~encoding.memory.profiler.learn_workspaces`); default none.
        model: a model already built in ``fake_mode`` by a step with the same ``build_model`` (:attr:`model` of
            another simulator whose step differs only in its inputs, e.g. the crop); default: built on first use.
        backend: ``"nccl"`` (default: GPUs) or ``"gloo"`` (CPU processes), see :func:`simulate_program`.
        sharded: the :attr:`sharded` models of another simulator of the same model, fake mode and backend (shared,
            like ``model``); default: its own.
        optimizers: the :attr:`optimizers` of that simulator (shared with ``model`` and ``sharded``); default: its
            own.
        sharded_from: a simulator of the same network with another recomputation policy (e.g. none), in the same
            fake mode: its model, sharded models and warmed optimizers stand for this one's, with this policy's
            recomputed modules switched on while a program runs (:func:`recompute_view`; where the two models
            differ otherwise, this simulator runs, shards and warms up its own).
        record: keep the events of every program it simulates whole (:meth:`result` with ``record``; a composed
            ``zero1`` or ``fsdp`` rank is recorded when asked), so that the advice can replay the programs of this
            simulator without simulating them again (:func:`~encoding.memory.advice.advise`'s ``simulator``).
    """

    def __init__(self, spec: StepSpec, round_to: int = 1, fake_mode: Any = None,
                 workspaces: Optional[Workspaces] = None, model: Optional[nn.Module] = None,
                 backend: str = "nccl", sharded: Optional[Dict[tuple, nn.Module]] = None,
                 optimizers: Optional[Dict[tuple, Any]] = None, record: bool = False,
                 sharded_from: Optional["Simulator"] = None) -> None:
        self.spec = spec
        self._sharded_from = sharded_from
        self._recomputed: Optional[List[str]] = None  # with sharded_from: the modules recomputed here, not there
        self.record = record
        self.round_to = round_to
        self.fake_mode = fake_mode if fake_mode is not None else new_fake_mode()
        self.workspaces = workspaces
        self.backend = backend
        self._model: Optional[nn.Module] = model
        self._cache: Dict[DeviceProgram, ProgramResult] = {}
        self._runs = 0
        self._zero: Dict[int, List[tuple]] = {}
        self._fsdp: Dict[int, List[int]] = {}  # world size -> per rank, the first rank with its shards' sizes
        #: a group of ranks that run the same forward and backward (:meth:`_rank_group`) -> its first rank, simulated
        #: whole, and once a second rank is asked, that forward and backward's peak above the start where composing
        #: is exact, else None (:meth:`_rank_result`)
        self._firsts: Dict[tuple, DeviceProgram] = {}
        self._frames: Dict[tuple, Optional[int]] = {}
        #: how many rests of steps were simulated alone (``zero1`` and ``fsdp`` ranks composed)
        self.rests_run = 0
        #: how many steps were simulated without their rest (:meth:`forward_backward`; also in :attr:`programs_run`)
        self.heads_run = 0
        #: (world size, rank) -> the model sharded for ``fsdp`` (see :meth:`sharded_model`)
        self.sharded: Dict[tuple, nn.Module] = {} if sharded is None else sharded
        #: the warmed optimizers of the programs run on :attr:`model` and :attr:`sharded` (one warm-up step each,
        #: see :func:`~encoding.memory.program.run_program`)
        self.optimizers: Dict[tuple, Any] = {} if optimizers is None else optimizers

    @property
    def sharded_from(self) -> Optional["Simulator"]:
        """The simulator whose sharded models this one uses (its ``sharded_from``), or ``None``."""
        return self._sharded_from

    @property
    def programs_run(self) -> int:
        """How many programs were simulated (each distinct one once; again only to record its events)."""
        return self._runs

    @property
    def model(self) -> nn.Module:
        """The step's model on fake tensors (built on first use), shared by the programs."""
        if self._model is None:
            self._model = build_fake_model(self.spec, self.fake_mode)
        return self._model

    def result(self, program: DeviceProgram, record: bool = False, observer: Any = None) -> ProgramResult:
        """The (cached) simulation of ``program``; devices with nothing to hold peak at 0. ``record``: with its
        step's events (:attr:`ProgramResult.trace`; simulated again if the cached one has none). ``observer``:
        simulated again under it (see :func:`simulate_program`), the result cached."""
        if not program.share and not program.keeps_module:
            return ProgramResult(0, 0.0)
        asked, record = record, record or self.record
        key = self.representative(program)
        if key.strategy in _COMPOSED_RANKS and key not in self._cache and not asked and observer is None:
            self._cache[key] = self._rank_result(key, record)  # composed ones keep no events
        # a composed rank keeps no events: recorded when asked (a simulator that records every program records
        # the ones it simulates whole)
        if key not in self._cache or (asked and self._cache[key].trace is None) or observer is not None:
            self._cache[key] = self._simulate(key, record, observer)
        return self._cache[key]

    def representative(self, program: DeviceProgram) -> DeviceProgram:
        """The program whose simulation stands for ``program``'s: :meth:`DeviceProgram.canonical`, its rank the
        first with the same sizes (``zero1``: of the partition it owns, ``fsdp``: of its shards)."""
        key = program.canonical()
        if key.strategy == "zero1":
            return dataclasses.replace(key, rank=self._zero_rank(key.replicas, key.rank))
        if key.strategy == "fsdp":
            return dataclasses.replace(key, rank=self._fsdp_rank(key.replicas, key.rank))
        return key

    def forward_backward(self, program: DeviceProgram) -> Tuple[int, List[tuple]]:
        """The recorded events of ``program``'s step up to the mark where its forward and backward end (and its
        gradients dropped), without the rest: :attr:`ProgramResult.trace` of a step whose rest another program
        ran (:func:`~encoding.memory.replay.compose` puts the two together). Not cached."""
        trace = self._simulate(self.representative(program), True, forward_backward_only=True).trace
        assert trace is not None
        return trace

    def _simulate(self, key: DeviceProgram, record: bool = False, observer: Any = None,
                  gradients_only: bool = False, on_rank: Optional[int] = None,
                  forward_backward_only: bool = False) -> ProgramResult:
        """``key`` simulated (``gradients_only``: its rest alone; ``on_rank``: an ``fsdp`` rank's rest on the model
        sharded for that other rank, viewed as its own, :func:`~encoding.memory.sharded.rank_view`;
        ``forward_backward_only``: without its rest)."""
        base = self._base()
        owner = self if base is None else base  # whose model (sharded models) and warmed optimizers run it
        model = owner.model
        with contextlib.ExitStack() as view:
            if key.strategy == "fsdp":
                model = owner.sharded_model(key.replicas, key.rank if on_rank is None else on_rank)
            if base is not None and self._recomputed:
                view.enter_context(recomputing(model, self._recomputed))
            if key.strategy == "fsdp" and on_rank is not None and on_rank != key.rank:
                with self.fake_mode:  # the views are made on fake tensors
                    view.enter_context(rank_view(model, key.replicas, key.rank))
            result = simulate_program(self.spec, key, self.round_to, self.fake_mode, self.workspaces, model,
                                      self.backend, record, owner.optimizers, observer, gradients_only,
                                      forward_backward_only)
        if gradients_only:
            self.rests_run += 1
        else:
            self._runs += 1
            self.heads_run += forward_backward_only
        return result

    @staticmethod
    def _rank_group(key: DeviceProgram) -> tuple:
        """What ranks of one step share a forward and backward: every ``zero1`` rank (DDP's, over every parameter)
        and every ``fsdp`` rank (FSDP2 pads every rank's shard to the first chunk's size: the same all-gathers and
        reduce-scatters on every rank)."""
        return key.strategy, key.share, key.total, key.replicas

    def _rank_result(self, key: DeviceProgram, record: bool = False) -> ProgramResult:
        """A ``zero1`` or ``fsdp`` rank composed: the ranks of a group (:meth:`_rank_group`) run the same forward
        and backward and differ only in the optimizer state of their partition (shards), held through it, and in the
        step of that partition after it. The first rank of a group is simulated whole; when another is asked, the
        first's rest is simulated alone (``gradients_only``), and where the two agree (the same bytes at the start,
        between, and the same peak of the rest), every other rank is its rest alone plus the first rank's forward
        and backward above its own start. Where they do not, every rank is simulated whole."""
        group = self._rank_group(key)
        first = self._firsts.setdefault(group, key)
        if first == key:
            return self._simulate(key, record)
        if group not in self._frames:
            whole = self.result(first)
            rest = self._simulate(first, gradients_only=True)
            exact = whole.phases is not None and rest.phases is not None and \
                (whole.phases[0], whole.phases[2], whole.phases[3]) == (rest.phases[0], rest.phases[2], rest.phases[3])
            self._frames[group] = whole.phases[1] - whole.phases[0] if exact else None
        frame = self._frames[group]
        if frame is None:
            return self._simulate(key)
        rest = self._simulate(key, gradients_only=True, on_rank=first.rank)
        start, _, after, between = rest.phases
        return ProgramResult(max(start + frame, after), rest.seconds, (start, start + frame, after, between))

    def _base(self) -> Optional["Simulator"]:
        """``sharded_from`` where its model differs from this one's only in the modules this one recomputes
        (:func:`recompute_view`, checked on first use), else ``None``: then this simulator runs its own model,
        sharded models and optimizers."""
        if self._sharded_from is not None and self._recomputed is None:
            self._recomputed = recompute_view(self._sharded_from.model, self.model)
            if self._recomputed is None:  # the models differ otherwise
                self._sharded_from = None
        return self._sharded_from

    def sharded_model(self, world_size: int, rank: int = 0) -> nn.Module:
        """A model of the step sharded for ``fsdp`` as ``rank`` of ``world_size`` ranks (built and sharded on first
        use, then shared by the ``fsdp`` programs of the ranks whose shards have its sizes)."""
        base = self._base()
        if base is not None:
            return base.sharded_model(world_size, rank)
        if (world_size, rank) not in self.sharded:
            with rank_world(world_size, rank), self.fake_mode, chunks_on_demand():
                self.sharded[world_size, rank] = shard_model(without_constants(self.spec.build_model()),
                                                             staged_collectives=self.backend == "gloo")
        return self.sharded[world_size, rank]

    def _fsdp_rank(self, world_size: int, rank: int) -> int:
        """The first rank whose ``fsdp`` shards have the sizes of ``rank``'s: ``fully_shard`` gives each rank its
        ``torch.chunk`` of every parameter along dim 0, so a rank past a parameter's last full chunk holds less (or
        none) of it, and its gradients and optimizer state with it."""
        if world_size not in self._fsdp:
            rows = [p.shape[0] if p.dim() else 1 for p in self.model.parameters()]
            steps = [-(-n // world_size) for n in rows]
            shapes = [tuple(max(0, min(step, n - r * step)) for n, step in zip(rows, steps))
                      for r in range(world_size)]
            first: Dict[tuple, int] = {}
            self._fsdp[world_size] = [first.setdefault(shape, r) for r, shape in enumerate(shapes)]
        return self._fsdp[world_size][rank]

    def zero_partitions(self, world_size: int) -> List[tuple]:
        """Per rank, the sizes of the parameters it owns under ``ZeroRedundancyOptimizer`` (cached)."""
        if world_size not in self._zero:
            params = [p for p in self.model.parameters() if p.requires_grad]
            with self.fake_mode:
                self._zero[world_size] = zero_partitions(params, world_size)
        return self._zero[world_size]

    def _zero_rank(self, world_size: int, rank: int) -> int:
        """The first rank whose ``ZeroRedundancyOptimizer`` partition has the sizes of ``rank``'s."""
        partitions = self.zero_partitions(world_size)
        return partitions.index(partitions[rank])

    def peak(self, program: DeviceProgram) -> int:
        """Simulated peak bytes of ``program``."""
        return self.result(program).peak

    def peaks(self, strategy: str, split: Sequence[int]) -> List[int]:
        """Peak bytes per device for ``strategy`` with samples per device ``split``."""
        return [self.peak(p) for p in device_programs(strategy, split)]


def heaviest_program(simulator: Simulator, strategy: str, share: int, num_devices: int) -> DeviceProgram:
    """The device program with the largest peak of ``strategy`` when every device holds ``share`` samples: device 0
    of ``gather`` / ``balanced`` (it holds what the others hold and the module's state), any ``ddp`` rank, ``fsdp``'s
    rank 0 (``torch.chunk``'s first chunk is the longest: its shards, gradients and state are each at least any other
    rank's, allocated in the same order), the ``zero1`` rank whose partition's state takes the most allocated bytes
    (:func:`_held`)."""
    total = share * num_devices
    if strategy in ("gather", "balanced"):
        return DeviceProgram(strategy, share, total, True, num_devices)
    rank = 0
    if strategy == "zero1":
        held = [_held(simulator, sizes) for sizes in simulator.zero_partitions(num_devices)]
        rank = held.index(max(held))
    return DeviceProgram(strategy, share, total, False, num_devices, rank)


def _held(simulator: Simulator, sizes: Sequence[int]) -> Tuple[int, int]:
    """What a ``zero1`` partition of parameters of ``sizes`` elements makes its rank hold per tensor of its state:
    the bytes as allocated (each tensor rounded up to the simulator's granularity: many small tensors can hold more
    than fewer elements in larger ones), then the elements."""
    itemsize = next(simulator.model.parameters()).element_size()
    step = simulator.round_to
    return sum(-(-n * itemsize // step) * step for n in sizes), sum(sizes)
