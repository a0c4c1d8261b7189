"""Memory balance per device: the logic of ``scripts/memory_balance.py``.

Runs training steps of a segmentation model under each strategy — ``gather`` (``torch.nn.DataParallel``),
``balanced`` (:class:`~encoding.parallel.DataParallelModel` + :class:`~encoding.parallel.DataParallelCriterion`),
``balanced-auto`` (the same with the split of :func:`~encoding.parallel.balance.plan_split`) and ``ddp`` — and
reports each device's peak memory: simulated for ``--simulate N`` virtual devices (no GPU needed, see
:mod:`encoding.parallel.memory`), or measured with ``torch.cuda.max_memory_allocated`` on ``--devices``. Writes a
table, a JSON file and (with matplotlib) a PNG bar chart. See ``docs/memory.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Union

import torch

from ..parallel.balance import max_batch, strategy_peaks
from ..parallel.memory import MIB, STRATEGIES, Simulator, StepSpec, learn_workspaces
from ..utils.files import atomic_write

__all__ = ["parse_memory", "segmentation_spec", "build_parser", "parse_args", "memory_report", "format_report",
           "write_chart", "main"]

_UNITS = {"": 1, "b": 1, "k": 2 ** 10, "kb": 10 ** 3, "kib": 2 ** 10, "m": 2 ** 20, "mb": 10 ** 6, "mib": 2 ** 20,
          "g": 2 ** 30, "gb": 10 ** 9, "gib": 2 ** 30, "t": 2 ** 40, "tb": 10 ** 12, "tib": 2 ** 40}
#: Allocation granularity of the CUDA caching allocator (blocks are multiples of 512 bytes).
CUDA_BLOCK = 512


def parse_memory(text: str) -> int:
    """``"11GiB"`` -> bytes; accepts B, KB/KiB, MB/MiB, GB/GiB, TB/TiB (K/M/G/T = binary) and plain numbers.

    Raises:
        ValueError: for anything else, or a size that is not positive.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"cannot read memory size {text!r}; write e.g. 11GiB, 11000MiB or 12GB")
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"memory size {text!r} must be positive")
    return value


def segmentation_spec(model: str, backbone: str, nclass: int, crop_size: int, aux: bool = False,
                      se_loss: bool = False, amp_dtype: Optional[torch.dtype] = None, seed: int = 0,
                      checkpoint: Union[bool, str] = False) -> StepSpec:
    """A training step of ``get_segmentation_model(model, backbone, nclass, aux, se_loss, checkpoint)`` on
    ``crop_size`` crops with :class:`~encoding.nn.SegmentationLosses` and SGD (momentum 0.9, weight decay 1e-4).
    ``checkpoint`` is the activation-checkpointing policy (``False``, ``"backbone"``, ``"all"``)."""
    from ..models import get_segmentation_model
    from ..nn import SegmentationLosses

    def build() -> torch.nn.Module:
        torch.manual_seed(seed)
        return get_segmentation_model(model, backbone=backbone, nclass=nclass, aux=aux, se_loss=se_loss,
                                      checkpoint=checkpoint)

    def make_inputs(share: int):
        return (torch.randn(share, 3, crop_size, crop_size),), {}

    def make_target(share: int) -> torch.Tensor:
        return torch.randint(0, nclass, (share, crop_size, crop_size))

    criterion = SegmentationLosses(se_loss=se_loss, aux=aux, nclass=nclass)
    return StepSpec(build_model=build, make_inputs=make_inputs, make_target=make_target, criterion=criterion,
                    amp_dtype=amp_dtype)


# ------------------------------------------------------------------------------------------------ options
def build_parser() -> argparse.ArgumentParser:
    """The options of ``scripts/memory_balance.py``."""
    p = argparse.ArgumentParser(
        prog="memory_balance.py",
        description="Peak memory per device of a training step under gather (nn.DataParallel), balanced "
                    "(DataParallelModel + DataParallelCriterion), balanced-auto and ddp; simulated with --simulate N "
                    "(no GPU needed) or measured on --devices.")
    p.add_argument("--model", default="fcn", help="segmentation model (default: fcn)")
    p.add_argument("--backbone", default="resnet50", help="backbone (default: resnet50)")
    p.add_argument("--dataset", default="pascal_voc", help="gives the class count and the default crop")
    p.add_argument("--nclass", type=int, default=None, help="class count (default: the dataset's)")
    p.add_argument("--batch-size", type=int, default=None, help="total batch (default: 2 per device)")
    p.add_argument("--crop-size", type=int, default=None, help="default: the dataset's")
    p.add_argument("--aux", action="store_true", help="auxiliary FCN head")
    p.add_argument("--se-loss", action="store_true", help="semantic-encoding loss (EncNet)")
    p.add_argument("--devices", default=None, help="CUDA devices to measure, e.g. 0,1,2,3")
    p.add_argument("--simulate", type=int, default=None, metavar="N",
                   help="simulate N virtual devices on fake tensors (default: 4 when there is no GPU)")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help=f"comma-separated, from {', '.join(STRATEGIES)}")
    p.add_argument("--steps", type=int, default=1, help="measured steps after one warm-up step (real devices)")
    p.add_argument("--amp", action="store_true", help="mixed precision (bf16 when simulating, fp16 on GPUs)")
    p.add_argument("--checkpoint", choices=["none", "backbone", "all"], default="none",
                   help="activation checkpointing of the model (every residual block, or blocks and heads); when "
                        "simulating, the report adds each device's peak without it and the saving")
    p.add_argument("--calibrate", action="store_true",
                   help="learn the kernels' workspaces that fake tensors miss from real steps of 1-3 samples on the "
                        "real device (a GPU where there is one, else the CPU)")
    p.add_argument("--max-batch", action="store_true",
                   help="also find, per strategy, the largest total batch that fits --memory-limit (simulated)")
    p.add_argument("--memory-limit", default="11GiB", help="memory per device for --max-batch (default: 11GiB)")
    p.add_argument("--json", default=None, metavar="PATH", help="JSON report (default: OUT_DIR/memory_balance.json)")
    p.add_argument("--chart", default=None, metavar="PATH", help="PNG chart (default: OUT_DIR/memory_balance.png)")
    p.add_argument("--out-dir", default="runs/memory", help="where the report files go (default: runs/memory)")
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
    if args.simulate is not None and args.simulate < 1:
        raise ValueError(f"--simulate must be at least 1 device, got {args.simulate}")
    if args.devices is not None:
        args.device_list = _cuda_devices(args.devices)
    elif args.simulate is None:
        args.simulate = 4
    count = args.simulate if args.devices is None else len(args.device_list)
    if args.dataset not in datasets:
        raise ValueError(f"--dataset: unknown {args.dataset!r}; valid: {', '.join(datasets)}")
    args.nclass = args.nclass or datasets[args.dataset].NUM_CLASS
    args.crop_size = args.crop_size or datasets[args.dataset].CROP_SIZE
    if args.crop_size <= 0 or args.nclass <= 0:
        raise ValueError("--crop-size and --nclass must be positive")
    if args.batch_size is None:
        args.batch_size = 2 * count
    if args.batch_size < count:
        raise ValueError(f"--batch-size {args.batch_size} is smaller than the {count} devices: every device needs "
                         "a sample to compare strategies")
    if args.steps < 1:
        raise ValueError(f"--steps must be at least 1, got {args.steps}")
    args.memory_limit_bytes = parse_memory(args.memory_limit)
    args.num_devices = count


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


# ------------------------------------------------------------------------------------------------ the report
def _summary(peaks: Sequence[int], split: Sequence[int], seconds: float) -> Dict[str, Any]:
    mib = [round(p / MIB, 2) for p in peaks]
    held = [p for p in peaks if p > 0]
    mean = sum(peaks) / len(peaks)
    return {"peak_mib": mib, "max_over_mean": round(max(peaks) / mean, 4) if mean else None,
            "max_over_min": round(max(held) / min(held), 4) if held and len(held) == len(peaks) else None,
            "step_s": round(seconds, 4), "split": list(split)}


def _config(args: argparse.Namespace, mode: str) -> Dict[str, Any]:
    keys = ("model", "backbone", "dataset", "nclass", "batch_size", "crop_size", "aux", "se_loss", "amp",
            "calibrate", "memory_limit", "checkpoint")
    config = {k: getattr(args, k) for k in keys}
    config.update(mode=mode, devices=args.num_devices, strategies=list(args.strategies))
    return config


def memory_report(args: argparse.Namespace, progress: bool = True) -> Dict[str, Any]:
    """Peaks per device for every requested strategy (and, with ``--max-batch``, the largest batch that fits).

    Returns:
        ``{"config": {...}, "strategies": {name: {"peak_mib", "max_over_mean", "max_over_min", "step_s",
        "split"[, "max_batch"][, "plain_peak_mib", "saving_mib"]}}}``; the last two (simulated, with
        ``--checkpoint``) are each device's peak without activation checkpointing and what it saves.
    """
    amp = (torch.float16 if args.devices is not None else torch.bfloat16) if args.amp else None
    spec_args = dict(model=args.model, backbone=args.backbone, nclass=args.nclass, crop_size=args.crop_size,
                     aux=args.aux, se_loss=args.se_loss, amp_dtype=amp, seed=args.seed,
                     checkpoint=False if args.checkpoint == "none" else args.checkpoint)
    spec = segmentation_spec(**spec_args)
    workspaces = None
    if args.calibrate:
        device = _calibration_device(args)
        _say(progress, f"calibrating on {device}: real steps of 1-3 samples ...")
        workspaces = learn_workspaces(spec, device=device)
    simulator = Simulator(spec, CUDA_BLOCK, workspaces=workspaces)
    report = {"config": _config(args, "measured" if args.devices is not None else "simulated"), "strategies": {}}
    for strategy in args.strategies:
        start = time.perf_counter()
        if args.devices is not None:
            from .cuda_memory import measure_strategy
            split = (strategy_peaks(simulator, strategy, args.batch_size, args.num_devices)[0]
                     if strategy == "balanced-auto" else None)
            split, peaks, seconds = measure_strategy(spec_args, strategy, args.device_list, args.batch_size, split,
                                                     args.steps)
        else:
            split, peaks = strategy_peaks(simulator, strategy, args.batch_size, args.num_devices)
            seconds = time.perf_counter() - start
        entry = _summary(peaks, split, seconds)
        if args.max_batch:
            entry["max_batch"] = max_batch(simulator, strategy, args.num_devices, args.memory_limit_bytes)
        if spec_args["checkpoint"] and args.devices is None:
            entry.update(_checkpoint_saving(dict(spec_args, checkpoint=False), strategy, args, peaks, workspaces))
        report["strategies"][strategy] = entry
        _say(progress, f"{strategy}: peaks {entry['peak_mib']} MiB ({time.perf_counter() - start:.1f} s)")
    return report


def _checkpoint_saving(plain_args: Dict[str, Any], strategy: str, args: argparse.Namespace, peaks: Sequence[int],
                       workspaces: Any) -> Dict[str, List[float]]:
    """Each device's simulated peak without activation checkpointing and what checkpointing saves there."""
    plain = strategy_peaks(Simulator(segmentation_spec(**plain_args), CUDA_BLOCK, workspaces=workspaces), strategy,
                           args.batch_size, args.num_devices)[1]
    return {"plain_peak_mib": [round(p / MIB, 2) for p in plain],
            "saving_mib": [round((p - c) / MIB, 2) for p, c in zip(plain, peaks)]}


def _calibration_device(args: argparse.Namespace) -> torch.device:
    """Where ``--calibrate`` learns the kernels' workspaces: the first measured GPU, else any GPU, else the CPU."""
    if args.devices is not None:
        return torch.device("cuda", args.device_list[0])
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _say(enabled: bool, text: str) -> None:
    if enabled:
        print(text, file=sys.stderr, flush=True)


def format_report(report: Dict[str, Any]) -> str:
    """The report as a table: one row per device (peak MiB per strategy), then max/mean, max/min, step time,
    split and, when computed, the largest batch that fits."""
    strategies = list(report["strategies"])
    rows = [["device"] + strategies]
    count = len(next(iter(report["strategies"].values()))["peak_mib"])
    for d in range(count):
        rows.append([str(d)] + [f"{report['strategies'][s]['peak_mib'][d]:.1f}" for s in strategies])
    fields = [("max/mean", "max_over_mean"), ("max/min", "max_over_min"), ("step s", "step_s"), ("split", "split")]
    if all("max_batch" in v for v in report["strategies"].values()):
        fields.append((f"max batch @ {report['config']['memory_limit']}", "max_batch"))
    if all("saving_mib" in v for v in report["strategies"].values()):
        fields += [("without checkpointing", "plain_peak_mib"), ("checkpointing saves", "saving_mib")]
    for label, key in fields:
        rows.append([label] + [_cell(report["strategies"][s][key]) for s in strategies])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(count + 2, "  ".join("-" * w for w in widths))
    c = report["config"]
    title = (f"peak memory per device (MiB), {c['mode']}: {c['model']}-{c['backbone']}, {c['nclass']} classes, "
             f"batch {c['batch_size']}, crop {c['crop_size']}, {c['devices']} device(s)")
    return title + "\n" + "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "/".join(str(v) for v in value)
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def write_chart(report: Dict[str, Any], path: str) -> bool:
    """A grouped bar chart (device x strategy, MiB) as PNG; ``False`` (and a hint) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed, so no chart was written; install it with: pip install matplotlib "
              "(or pip install -e '.[chart]')", file=sys.stderr)
        return False
    strategies = list(report["strategies"])
    count = len(report["strategies"][strategies[0]]["peak_mib"])
    width = 0.8 / len(strategies)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * count + 3), 4))
    for k, name in enumerate(strategies):
        xs = [d + (k - (len(strategies) - 1) / 2) * width for d in range(count)]
        ax.bar(xs, report["strategies"][name]["peak_mib"], width, label=name)
    c = report["config"]
    ax.set_xticks(range(count))
    ax.set_xticklabels([f"device {d}" for d in range(count)])
    ax.set_ylabel("peak memory (MiB)")
    ax.set_title(f"{c['model']}-{c['backbone']}, {c['nclass']} classes, batch {c['batch_size']}, "
                 f"crop {c['crop_size']} ({c['mode']})")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    return True


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Entry point of ``scripts/memory_balance.py``: print the table, write JSON and chart; return the report."""
    args = parse_args(argv)
    report = memory_report(args)
    print(format_report(report))
    json_path = args.json or os.path.join(args.out_dir, "memory_balance.json")
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    atomic_write(json_path, json.dumps(report, indent=2))
    print(f"wrote {json_path}")
    chart_path = args.chart or os.path.join(args.out_dir, "memory_balance.png")
    if write_chart(report, chart_path):
        print(f"wrote {chart_path}")
    return report
