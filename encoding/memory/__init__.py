"""encoding.memory: per-device memory of a training step under each data-parallel strategy, and the split that
balances it.

A training step (:class:`StepSpec`, e.g. :func:`segmentation_spec`) becomes one device program per device and
strategy (:class:`DeviceProgram`); the :class:`Simulator` runs each distinct program once on fake tensors and reports
its peak (no GPU, nothing allocated); :func:`measure_program_cpu` and :func:`measure_strategy` measure the same on
real CPU tensors and real GPUs. :func:`plan_split` / :func:`strategy_peaks` / :func:`max_batch` plan with the peaks,
and :class:`MemoryBalancer` is ``DataParallelModel(..., balance="memory")`` (registered with
:mod:`encoding.parallel.planners` when this package is imported). ``python -m encoding.memory`` is the command-line
tool (:func:`main`). See ``docs/memory.md``.

Modules, in dependency order: ``tracker`` (allocation counting), ``program`` (device programs), ``simulate``,
``profiler`` (real CPU steps, calibration), ``balance``, ``spec``, ``cuda`` (real GPUs), ``report`` (table, JSON,
chart), ``cli``.
"""
from .advice import Advice, advise
from .balance import MemoryBalancer, max_batch, plan_split, strategy_peaks
from .cli import build_parser, main
from .cuda import measure_strategy
from .planner import MemoryPlan, plan
from .profiler import learn_workspaces, measure_program_cpu
from .ranks import measure_ranks_cpu
from .program import DeviceProgram, StepSpec
from .simulate import Simulator, simulate_program
from .spec import segmentation_spec

__all__ = [
    "Simulator", "StepSpec", "DeviceProgram", "segmentation_spec", "simulate_program",
    "plan_split", "strategy_peaks", "max_batch", "MemoryBalancer",
    "measure_program_cpu", "measure_strategy", "learn_workspaces", "build_parser", "main",
    "plan", "MemoryPlan", "Advice", "advise", "measure_ranks_cpu",
]
