"""encoding.memory: per-device memory of a training step under each data-parallel strategy, and the split that
balances it.

A training step (:class:`StepSpec`, e.g. :func:`segmentation_spec`) becomes one device program per device and
strategy (:class:`DeviceProgram`); the :class:`Simulator` runs each distinct program once on fake tensors and reports
its peak (no GPU, nothing allocated); :func:`measure_program_cpu` and :func:`measure_strategy` measure the same on
real CPU tensors and real GPUs. :func:`plan_split` / :func:`strategy_peaks` / :func:`max_batch` plan with the peaks,
and :class:`MemoryBalancer` is ``DataParallelModel(..., balance="memory")`` (registered with
:mod:`encoding.parallel.planners` when this package is imported). ``python -m encoding.memory`` is the command-line
tool (:func:`main`, its options :func:`build_parser`). See ``docs/memory.md``.

Modules, in dependency order: ``tracker`` (allocation counting), ``program`` (device programs), ``simulate``,
``profiler`` (real CPU steps, calibration), ``balance``, ``spec``, ``cuda`` (real GPUs), ``ranks``, ``timeline``
(:func:`timeline`: each device's memory over one step, by kind; its pictures in ``timeline_draw``, its proof against
real allocations in ``timeline_real``); the tool's
``replay``, ``advice``, ``planner`` (:func:`plan`: ``MemoryPlan``), ``report`` (table, JSON, chart) and ``cli`` are
imported when used (:func:`plan`, :func:`build_parser`, :func:`main`, or importing them), not by ``import encoding``;
so are the measuring modules ``profiler``, ``cuda`` and ``ranks`` (:func:`measure_program_cpu`,
:func:`learn_workspaces`, :func:`measure_strategy`, :func:`measure_ranks_cpu` load them on the first call).
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence

from torch import nn

from .balance import MemoryBalancer, max_batch, plan_split, strategy_peaks
from .program import DeviceProgram, StepSpec
from .simulate import Simulator, simulate_program
from .spec import segmentation_spec, step_spec
from .timeline import timeline

if TYPE_CHECKING:  # annotations only: the planner loads when plan() is called
    from .planner import MemoryPlan

__all__ = [
    "Simulator", "StepSpec", "DeviceProgram", "segmentation_spec", "step_spec", "simulate_program",
    "plan_split", "strategy_peaks", "max_batch", "MemoryBalancer",
    "measure_program_cpu", "measure_strategy", "learn_workspaces", "build_parser", "main",
    "plan", "measure_ranks_cpu", "timeline",
]


def measure_program_cpu(*args: Any, **kwargs: Any) -> Any:
    """One device program measured on real CPU tensors: :func:`encoding.memory.profiler.measure_program_cpu` (the
    profiler loads on the first call)."""
    from .profiler import measure_program_cpu as measure

    return measure(*args, **kwargs)


def learn_workspaces(*args: Any, **kwargs: Any) -> Any:
    """Kernels' workspaces from a profiled real step: :func:`encoding.memory.profiler.learn_workspaces`."""
    from .profiler import learn_workspaces as learn

    return learn(*args, **kwargs)


def measure_strategy(*args: Any, **kwargs: Any) -> Any:
    """Peaks of a strategy measured on real GPUs: :func:`encoding.memory.cuda.measure_strategy`."""
    from .cuda import measure_strategy as measure

    return measure(*args, **kwargs)


def measure_ranks_cpu(*args: Any, **kwargs: Any) -> Any:
    """Per-rank peaks of real CPU processes: :func:`encoding.memory.ranks.measure_ranks_cpu`."""
    from .ranks import measure_ranks_cpu as measure

    return measure(*args, **kwargs)


def plan(model: nn.Module, criterion: Any, **options: Any) -> "MemoryPlan":
    """The memory plan of one training step of ``model``: :func:`encoding.memory.planner.plan` (same arguments;
    the planner and its advice load on the first call)."""
    from .planner import plan as make_plan

    return make_plan(model, criterion, **options)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m encoding.memory``: :func:`encoding.memory.cli.build_parser` (loads the tool)."""
    from .cli import build_parser as make_parser

    return make_parser()


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """``python -m encoding.memory``: :func:`encoding.memory.cli.main` (the tool loads on the first call)."""
    from .cli import main as run

    return run(argv)
