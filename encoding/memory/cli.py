"""The memory tool's command line: ``python -m encoding.memory`` (``scripts/memory_balance.py`` wraps it).

Runs training steps of a segmentation model under each strategy — ``gather`` (``torch.nn.DataParallel``),
``balanced`` (:class:`~encoding.parallel.DataParallelModel` + :class:`~encoding.parallel.DataParallelCriterion`),
``balanced-auto`` (the same with the split of :func:`~encoding.memory.balance.plan_split`) and ``ddp`` — and
reports each device's peak memory: simulated for ``--simulate N`` virtual devices (no GPU needed, see
:mod:`encoding.memory.simulate`), or measured with ``torch.cuda.max_memory_allocated`` on ``--devices``. Writes a
table, a JSON file and (with matplotlib) a PNG bar chart (:mod:`encoding.memory.report`). See ``docs/memory.md``.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence

import torch

from ..utils.cli import OneLineParser, positive_int, run_cli
from ..utils.files import refuse_own_input
from .planner import parse_memory
from .program import BACKENDS, DEFAULT_STRATEGIES, STRATEGIES
from .report import format_report, memory_report, write_chart, write_json

__all__ = ["parse_memory", "build_parser", "parse_args", "main", "cli"]

#: The memory size of ``--memory-limit`` when it is not given and ``--max-batch`` needs one.
DEFAULT_MEMORY_LIMIT = "11GiB"
#: What ``--advise`` keeps free of every device's ``--memory-limit`` by default: the CUDA context (300-500 MiB)
#: and the caching allocator's fragmentation, which the simulation of allocations does not see. Provisional: to be
#: replaced by what ``benchmarks/gpu_proof.py`` measures on a GPU (see docs/memory.md).
DEFAULT_RESERVE = "512MiB"


# ------------------------------------------------------------------------------------------------ options
def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m encoding.memory`` (``scripts/memory_balance.py``)."""
    p = OneLineParser(
        prog="python -m encoding.memory",
        description="Peak memory per device of a training step under gather (nn.DataParallel), balanced "
                    "(DataParallelModel + DataParallelCriterion), balanced-auto and ddp; simulated with --simulate N "
                    "(no GPU needed) or measured on --devices.")
    p.add_argument("--model", default="fcn", help="segmentation model (default: fcn)")
    p.add_argument("--backbone", default="resnet50", help="backbone (default: resnet50)")
    p.add_argument("--dataset", default="pascal_voc", help="gives the class count and the default crop")
    p.add_argument("--nclass", type=positive_int, default=None, help="class count (default: the dataset's)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="total batch (default: 2 per device)")
    p.add_argument("--crop-size", type=positive_int, default=None, help="square crop in pixels (default: the "
                   "dataset's)")
    p.add_argument("--aux", action="store_true", help="auxiliary FCN head")
    p.add_argument("--se-loss", action="store_true", help="semantic-encoding loss (EncNet)")
    p.add_argument("--devices", default=None, help="CUDA devices to measure, e.g. 0,1,2,3")
    p.add_argument("--simulate", type=positive_int, default=None, metavar="N",
                   help="simulate N virtual devices on fake tensors (default: 4 when there is no GPU)")
    p.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                   help=f"comma-separated, from {', '.join(STRATEGIES)} (default: {','.join(DEFAULT_STRATEGIES)})")
    p.add_argument("--steps", type=positive_int, default=1, help="measured steps after one warm-up step (real devices)")
    p.add_argument("--amp", nargs="?", const="auto", choices=["auto", "bf16", "fp16"], default=None,
                   help="mixed precision: bf16 or fp16 autocast (a bare --amp: bf16 when simulating, fp16 on GPUs)")
    p.add_argument("--keep-outputs", action="store_true",
                   help="simulate the loop that holds the outputs through backward (outputs = model(x); loss = "
                        "criterion(outputs, y); loss.backward()); default: train.py's, which frees them first")
    p.add_argument("--backend", choices=BACKENDS, default="nccl",
                   help="what the simulated ranks of fsdp communicate through: nccl (GPUs, in place; default) or gloo "
                        "(CPU processes: each all-gather and reduce-scatter is staged in a buffer of its own)")
    p.add_argument("--checkpoint", choices=["none", "backbone", "all"], default="none",
                   help="activation checkpointing of the model (every residual block, or blocks and heads); when "
                        "simulating, the report adds each device's peak without it and the saving")
    p.add_argument("--calibrate", action="store_true",
                   help="learn the kernels' workspaces that fake tensors miss from real steps of 1-3 samples on the "
                        "real device (a GPU where there is one, else the CPU)")
    p.add_argument("--max-batch", action="store_true",
                   help="also find, per strategy, the largest total batch that fits --memory-limit (simulated)")
    p.add_argument("--advise", action="store_true",
                   help="per strategy x checkpointing policy (none, backbone, all): the largest batch that fits "
                        "--memory-limit at the crop and the largest crop at the batch; marks the recommended one")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="memory per device with its unit (11GiB, 11000MiB, 12GB; a bare number is an error): "
                        f"--max-batch and --advise search under it (default there: {DEFAULT_MEMORY_LIMIT}), the "
                        "chart draws it as a line")
    p.add_argument("--reserve", default=DEFAULT_RESERVE, metavar="SIZE",
                   help="what --advise keeps free of --memory-limit for the CUDA context and fragmentation, which "
                        f"the simulation does not count (default: {DEFAULT_RESERVE}, provisional; 0B: none)")
    p.add_argument("--json", default=None, metavar="PATH", help="JSON report (default: OUT_DIR/memory_balance.json)")
    p.add_argument("--chart", default=None, metavar="PATH", help="PNG chart (default: OUT_DIR/memory_balance.png)")
    p.add_argument("--out-dir", default="runs/memory", help="where the report files go (default: runs/memory); "
                   "checked before any work")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse and check the options; every bad value ends in a one-line argparse error (exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _complete(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _complete(args: argparse.Namespace) -> None:
    from ..datasets import datasets

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"--strategies: unknown {', '.join(map(repr, unknown)) or 'empty list'}; "
                         f"valid: {', '.join(STRATEGIES)}")
    args.strategies = strategies
    if args.devices is not None and args.simulate is not None:
        raise ValueError("--devices measures real GPUs and --simulate N simulates; give one of them")
    if args.devices is not None:
        args.device_list = _cuda_devices(args.devices)
    elif args.simulate is None:
        args.simulate = 4
    count = args.simulate if args.devices is None else len(args.device_list)
    if args.dataset not in datasets:
        raise ValueError(f"--dataset: unknown {args.dataset!r}; valid: {', '.join(datasets)}")
    args.nclass = datasets[args.dataset].NUM_CLASS if args.nclass is None else args.nclass
    _check_network(args)
    args.crop_size = datasets[args.dataset].CROP_SIZE if args.crop_size is None else args.crop_size
    if args.batch_size is None:
        args.batch_size = 2 * count
    if args.batch_size < count:
        raise ValueError(f"--batch-size {args.batch_size} is smaller than the {count} devices: every device needs "
                         "a sample to compare strategies")
    if args.advise and args.devices is not None:
        raise ValueError("--advise simulates; use it with --simulate N, not --devices")
    if args.amp == "auto":
        args.amp = "fp16" if args.devices is not None else "bf16"
    if args.memory_limit is None and (args.max_batch or args.advise):
        args.memory_limit = DEFAULT_MEMORY_LIMIT
    try:
        args.memory_limit_bytes = None if args.memory_limit is None else parse_memory(args.memory_limit)
    except ValueError as exc:
        raise ValueError(f"--memory-limit: {exc}") from None
    args.reserve_bytes = _reserve(args.reserve)
    args.num_devices = count
    args.json_path = args.json or os.path.join(args.out_dir, "memory_balance.json")
    args.chart_path = args.chart or os.path.join(args.out_dir, "memory_balance.png")
    _check_writable("--json" if args.json else "--out-dir", args.json_path)
    _check_writable("--chart" if args.chart else "--out-dir", args.chart_path)
    refuse_own_input([args.json_path, args.chart_path], [], "--json / --chart")  # one file for both: one would go


def _check_network(args: argparse.Namespace) -> None:
    """Fail before any work on a model / backbone the simulation cannot build (built on the ``meta`` device: no
    memory, no weights)."""
    from ..models import get_segmentation_model

    try:
        with torch.device("meta"):
            get_segmentation_model(args.model, backbone=args.backbone, nclass=args.nclass, aux=args.aux,
                                   se_loss=args.se_loss, checkpoint=False if args.checkpoint == "none"
                                   else args.checkpoint)
    except (ValueError, KeyError, TypeError, NotImplementedError, RuntimeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"--model {args.model} --backbone {args.backbone}: {reason}") from None


def _reserve(text: str) -> int:
    """``--reserve``: a memory size, or zero (``0B``, ``0``)."""
    if text.strip().upper() in ("0", "0B"):
        return 0
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise ValueError(f"--reserve: {exc}") from None


def _check_writable(option: str, path: str) -> None:
    """Fail before any work when ``path`` cannot be written: it is a directory, a file stands where its folder
    would be, or no file can be made in the nearest existing folder (tried: permissions alone do not tell, e.g.
    under ``/proc`` or on a read-only mount)."""
    if os.path.isdir(path):
        raise ValueError(f"{option}: {path!r} is a directory; give a file path")
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{option}: cannot write {path!r}: {existing!r} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{option}: cannot write {path!r}: the folder {existing!r} is not writable")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        raise ValueError(f"{option}: cannot write {path!r}: no file can be made in {existing!r} "
                         f"({err.strerror or type(err).__name__})") from None


def _cuda_devices(text: str) -> List[int]:
    try:
        indices = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"--devices must be comma-separated CUDA indices such as 0,1,2,3, got {text!r}") from None
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    bad = [i for i in indices if not 0 <= i < available]
    if not indices or bad:
        raise ValueError(f"--devices {text!r}: this machine has {available} CUDA device(s); without a GPU use "
                         "--simulate N")
    return indices


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Entry point of ``python -m encoding.memory`` (and ``scripts/memory_balance.py``): print the table, write
    JSON and chart; return the report."""
    args = parse_args(argv)
    report = memory_report(args)
    print(format_report(report))
    write_json(report, args.json_path)
    print(f"wrote {args.json_path}")
    if write_chart(report, args.chart_path):
        print(f"wrote {args.chart_path}")
    return report


def cli(argv: Optional[Sequence[str]] = None) -> int:
    """``main`` for the command line: an ``EncodingError`` is one line on stderr, a bug keeps its traceback
    (``--traceback`` shows them all); returns the exit status."""
    return run_cli("python -m encoding.memory", main, argv)
