"""The simulator: peak bytes of device programs run on fake tensors (``FakeTensorMode``: shapes, dtypes and
storages, no memory allocated, no kernel run) under :class:`~encoding.memory.tracker.AllocationTracker`.

:func:`simulate_program` runs one :class:`~encoding.memory.program.DeviceProgram`; :class:`Simulator` runs each
distinct program of one :class:`~encoding.memory.program.StepSpec` once (cached) and gives the peaks per device of a
strategy and split.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Sequence

from torch import nn

from .program import DeviceProgram, ProgramResult, StepSpec, device_programs, run_program
from .sharded import rank_world, shard_model, zero_partitions
from .tracker import AllocationTracker, Workspaces

__all__ = ["new_fake_mode", "simulate_program", "Simulator"]


def new_fake_mode() -> Any:
    """A ``FakeTensorMode`` that accepts real tensors as constants."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


def simulate_program(spec: StepSpec, program: DeviceProgram, round_to: int = 1, fake_mode: Any = None,
                     workspaces: Optional[Workspaces] = None, model: Optional[nn.Module] = None,
                     backend: str = "nccl", record: bool = False,
                     optimizers: Optional[Dict[tuple, Any]] = None) -> ProgramResult:
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
    """
    tracker = AllocationTracker(round_to, workspaces, (program.share, program.total))
    start, marks = [0], []  # live when the measured step starts; peak of its forward and backward

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
        tracker.reset_peak()

    with (fake_mode or new_fake_mode()), tracker:
        seconds = run_program(spec, program, "cpu", window, track=tracker.track, model=model, backend=backend,
                              mark=mark, optimizers=optimizers)
    phases = (start[0], marks[0], tracker.peak) if len(marks) == 1 else None
    return ProgramResult(max(marks + [tracker.peak]), seconds, phases, (start[0], trace) if record else None)


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
        record: keep every program's events (:meth:`result` with ``record``), so that the advice can replay the
            programs of this simulator without simulating them again (:func:`~encoding.memory.advice.advise`'s
            ``simulator``).
    """

    def __init__(self, spec: StepSpec, round_to: int = 1, fake_mode: Any = None,
                 workspaces: Optional[Workspaces] = None, model: Optional[nn.Module] = None,
                 backend: str = "nccl", sharded: Optional[Dict[int, nn.Module]] = None,
                 optimizers: Optional[Dict[tuple, Any]] = None, record: bool = False) -> None:
        self.spec = spec
        self.record = record
        self.round_to = round_to
        self.fake_mode = fake_mode if fake_mode is not None else new_fake_mode()
        self.workspaces = workspaces
        self.backend = backend
        self._model: Optional[nn.Module] = model
        self._cache: Dict[DeviceProgram, ProgramResult] = {}
        self._runs = 0
        self._zero: Dict[int, List[tuple]] = {}
        #: world size -> the model sharded for ``fsdp`` (see :meth:`sharded_model`)
        self.sharded: Dict[int, nn.Module] = {} if sharded is None else sharded
        #: the warmed optimizers of the programs run on :attr:`model` and :attr:`sharded` (one warm-up step each,
        #: see :func:`~encoding.memory.program.run_program`)
        self.optimizers: Dict[tuple, Any] = {} if optimizers is None else optimizers

    @property
    def programs_run(self) -> int:
        """How many programs were simulated (each distinct one once; again only to record its events)."""
        return self._runs

    @property
    def model(self) -> nn.Module:
        """The step's model on fake tensors (built on first use), shared by the programs."""
        if self._model is None:
            with self.fake_mode:
                self._model = self.spec.build_model()
        return self._model

    def result(self, program: DeviceProgram, record: bool = False) -> ProgramResult:
        """The (cached) simulation of ``program``; devices with nothing to hold peak at 0. ``record``: with its
        step's events (:attr:`ProgramResult.trace`; simulated again if the cached one has none)."""
        if not program.share and not program.keeps_module:
            return ProgramResult(0, 0.0)
        record = record or self.record
        key = program.canonical()
        if key not in self._cache:
            if key.strategy == "zero1":  # ranks that own equal partitions hold the same
                key = dataclasses.replace(key, rank=self._zero_rank(key.replicas, key.rank))
        if key not in self._cache or (record and self._cache[key].trace is None):
            model = self.sharded_model(key.replicas) if key.strategy == "fsdp" else self.model
            self._cache[key] = simulate_program(self.spec, key, self.round_to, self.fake_mode, self.workspaces,
                                                model, self.backend, record, self.optimizers)
            self._runs += 1
        return self._cache[key]

    def sharded_model(self, world_size: int) -> nn.Module:
        """A model of the step sharded for ``fsdp`` on ``world_size`` ranks (built and sharded on first use, then
        shared by the ``fsdp`` programs: every rank holds equal shards)."""
        if world_size not in self.sharded:
            with rank_world(world_size, 0), self.fake_mode:
                self.sharded[world_size] = shard_model(self.spec.build_model(),
                                                       staged_collectives=self.backend == "gloo")
        return self.sharded[world_size]

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
