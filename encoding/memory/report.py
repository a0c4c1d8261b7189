"""The memory report: peaks per device for every requested strategy (:func:`memory_report`, simulated with
:class:`~encoding.memory.simulate.Simulator` or measured by :mod:`encoding.memory.cuda`), and its three forms: a
table (:func:`format_report`), a JSON file (:func:`write_json`) and a PNG bar chart (:func:`write_chart`).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import textwrap
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from ..names import network_name
from ..models.network import NetworkSpec
from ..utils.files import atomic_write
from ..utils.curves import save_figure
from .advice import advise
from .ahead import TracesAhead, traces_ahead
from .balance import max_batch, strategy_peaks
from .planner import AMP_DTYPES, loop_name
from .optimizers import optimizer_factory
from .profiler import calibration_shares, learn_workspaces
from .simulate import Simulator
from .spec import buildable_policies, step_spec
from .tracker import CUDA_BLOCK, MIB


def advice_budget(args: argparse.Namespace) -> int:
    """The bytes per device the advice may spend on allocations: ``--memory-limit`` less ``--reserve``."""
    return max(0, args.memory_limit_bytes - getattr(args, "reserve_bytes", 0))

__all__ = ["memory_report", "step_arguments", "format_report", "format_advice", "write_json", "write_chart",
           "chart_figure"]


def _summary(peaks: Sequence[int], split: Sequence[int], seconds: Optional[float]) -> Dict[str, Any]:
    """One strategy's entry; ``step_s`` only for a measured step (a simulation's own time is no step time)."""
    mib = [round(p / MIB, 2) for p in peaks]
    held = [p for p in peaks if p > 0]
    mean = sum(peaks) / len(peaks)
    entry = {"peak_mib": mib, "max_over_mean": round(max(peaks) / mean, 4) if mean else None,
             "max_over_min": round(max(held) / min(held), 4) if held and len(held) == len(peaks) else None}
    if seconds is not None:
        entry["step_s"] = round(seconds, 4)
    entry["split"] = list(split)
    return entry


def _config(args: argparse.Namespace, mode: str) -> Dict[str, Any]:
    keys = ("model", "backbone", "dataset", "nclass", "batch_size", "crop_size", "aux", "se_loss", "amp",
            "calibrate", "memory_limit", "keep_outputs", "backend", "reserve", "loss", "optimizer", "momentum",
            "weight_decay")
    config = {k: getattr(args, k) for k in keys}
    config["recompute"] = args.recompute
    config["loop"] = loop_name(args.keep_outputs)
    config.update(mode=mode, devices=args.num_devices, strategies=list(args.strategies),
                  memory_limit_mib=None if args.memory_limit_bytes is None else round(args.memory_limit_bytes / MIB, 2))
    if mode == "measured":
        config["steps"] = args.steps
    return config


def step_arguments(args: argparse.Namespace) -> Dict[str, Any]:
    """The :func:`~encoding.memory.spec.step_spec` arguments of the tool's options: the network
    (:meth:`NetworkSpec.from_options <encoding.models.network.NetworkSpec.from_options>`, every network option of
    training) and the step."""
    return dict(network=NetworkSpec.from_options(args, args.nclass), crop_size=args.crop_size,
                amp_dtype=AMP_DTYPES.get(args.amp), seed=args.seed, keep_outputs=args.keep_outputs, loss=args.loss,
                optimizer=optimizer_factory(args.optimizer, args.momentum, args.weight_decay))


def _with(spec_args: Dict[str, Any], policy: str, **changes: Any) -> Dict[str, Any]:
    """``spec_args`` with the recomputation policy ``policy`` (and other step arguments ``changes``)."""
    return dict(spec_args, network=spec_args["network"].replace(recompute=policy), **changes)


def memory_report(args: argparse.Namespace, progress: bool = True, ahead: bool = False) -> Dict[str, Any]:
    """Peaks per device for every requested strategy (and, with ``--max-batch``, the largest batch that fits).

    Returns:
        A dict with ``"config"`` (the options) and ``"strategies"``, which maps each strategy name to a dict with
        ``"peak_mib"``, ``"max_over_mean"``, ``"max_over_min"``, ``"split"``, ``"step_s"`` (the measured step's
        seconds, only on real devices), ``"max_batch"`` with ``--max-batch``, and ``"plain_peak_mib"`` and
        ``"saving_mib"`` when simulated with ``--recompute`` (each device's peak without activation checkpointing
        and what it saves); with ``--advise``, ``"advice"`` (one dict per strategy x checkpointing policy:
        ``strategy``, ``recompute``, ``max_batch``, ``per_device``, ``max_crop``, ``recommended``) and
        ``"advise_s"`` (its seconds; ``"advise_cpu_s"``: of CPU time, a second process's included).

    ``ahead``: with ``--advise``, what the advice needs besides the table traced meanwhile in a second process
    (:mod:`~encoding.memory.ahead`, the command line's: forked before the first simulation, where it is safe).
    """
    spec_args = step_arguments(args)
    spec = step_spec(**spec_args)
    workspaces = None
    if args.calibrate:
        device = _calibration_device(args)
        shares = calibration_shares(device)
        _say(progress, f"calibrating on {device}: real steps of {', '.join(map(str, shares))} samples ...")
        workspaces = learn_workspaces(spec, shares, device=device)
    # recorded: the advice replays the programs the table simulated (the same step at the same crop)
    simulator = Simulator(spec, CUDA_BLOCK, workspaces=workspaces, backend=args.backend, record=args.advise)
    report = {"config": _config(args, "measured" if args.devices is not None else "simulated"), "strategies": {}}
    policies = buildable_policies(spec_args["network"]) if args.advise else ()  # (--advise simulates: no --devices)

    def spec_for(crop: int, policy: str) -> Any:  # the advice's steps
        return step_spec(**_with(spec_args, policy, crop_size=crop))
    traces = traces_ahead(spec_for, args.strategies, args.num_devices, args.batch_size, args.crop_size, CUDA_BLOCK,
                          args.backend, policies, args.recompute) if ahead and workspaces is None else None
    with traces or contextlib.nullcontext():
        _table(args, spec_args, simulator, workspaces, report, progress)
        if args.advise:
            _advice(args, spec_for, simulator, policies, traces, report, progress)
    return report


def _table(args: argparse.Namespace, spec_args: Dict[str, Any], simulator: Simulator, workspaces: Any,
           report: Dict[str, Any], progress: bool) -> None:
    """The peaks of every strategy, into ``report["strategies"]``."""
    for strategy in args.strategies:
        start = time.perf_counter()
        if args.devices is not None:
            from .cuda import measure_strategy  # CUDA, processes: only when measuring
            split = (strategy_peaks(simulator, strategy, args.batch_size, args.num_devices)[0]
                     if strategy == "balanced-auto" else None)
            split, peaks, seconds = measure_strategy(spec_args, strategy, args.device_list, args.batch_size, split,
                                                     args.steps)
        else:
            split, peaks = strategy_peaks(simulator, strategy, args.batch_size, args.num_devices)
            seconds = None  # the simulator's own time is not a step time
        entry = _summary(peaks, split, seconds)
        if args.max_batch:
            entry["max_batch"] = max_batch(simulator, strategy, args.num_devices, args.memory_limit_bytes)
        if args.recompute != "none" and args.devices is None:
            entry.update(_checkpoint_saving(_with(spec_args, "none"), strategy, args, peaks, workspaces))
        report["strategies"][strategy] = entry
        _say(progress, f"{strategy}: {'simulated' if args.devices is None else 'measured'} in "
                       f"{time.perf_counter() - start:.1f} s")


def _advice(args: argparse.Namespace, spec_for: Callable[[int, str], Any], simulator: Simulator,
            policies: Sequence[str], ahead: Optional[TracesAhead], report: Dict[str, Any], progress: bool) -> None:
    """The ``--advise`` rows and their time, into ``report``."""
    start, cpu, stats = time.perf_counter(), time.process_time(), {}
    report["advice"] = [row.as_dict() for row in advise(
        spec_for, args.strategies, args.num_devices, args.batch_size, args.crop_size,
        advice_budget(args), CUDA_BLOCK, policies=policies, stats=stats, backend=args.backend,
        simulator=(args.recompute, simulator), ahead=ahead, workspaces=simulator.workspaces)]  # --calibrate's
    report["advise_s"] = round(time.perf_counter() - start, 2)
    report["advise_cpu_s"] = round(time.process_time() - cpu + (ahead.cpu_s if ahead else 0.0), 2)
    also = f" ({stats['ahead']} of them ahead, in a second process)" if stats["ahead"] else ""
    _say(progress, f"advice: {stats['programs']} device programs simulated{also} in {report['advise_s']:.1f} s")


def _checkpoint_saving(plain_args: Dict[str, Any], strategy: str, args: argparse.Namespace, peaks: Sequence[int],
                       workspaces: Any) -> Dict[str, List[float]]:
    """Each device's simulated peak without activation checkpointing and what checkpointing saves there."""
    plain = strategy_peaks(Simulator(step_spec(**plain_args), CUDA_BLOCK, workspaces=workspaces,
                                     backend=args.backend), strategy, args.batch_size, args.num_devices)[1]
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


#: The table's width limit (characters).
TABLE_WIDTH = 119
#: The most devices the table shows one by one and the chart draws as grouped bars; past it both summarise each
#: strategy's devices (min / median / max and the devices at the max).
MAX_BARS = 32


def _options(config: Dict[str, Any]) -> str:
    """The strategy options of a report in words: mode, checkpointing, mixed precision, calibration, steps."""
    mode = config["mode"] + (f", {config['steps']} measured step(s)" if config.get("steps") else "")
    amp = config["amp"]
    if amp is True:  # a report of the boolean --amp: bf16 simulated, fp16 measured
        amp = "fp16" if config["mode"] == "measured" else "bf16"
    backend = f", --backend {config['backend']}" if config.get("backend", "nccl") != "nccl" else ""
    return (f"{mode}; --recompute {config['recompute']}, --amp {amp or 'off'}{backend}, "
            f"--calibrate {'on' if config['calibrate'] else 'off'}; "
            f"loop: {config.get('loop') or loop_name(config.get('keep_outputs', False))}")


def _title(config: Dict[str, Any]) -> str:
    return (f"{network_name(config['model'], config['backbone'])}, {config['nclass']} classes, "
            f"batch {config['batch_size']}, "
            f"crop {config['crop_size']}, {config['devices']} device(s)")


def device_ranges(devices: Sequence[int], shown: int = 2) -> str:
    """Device indices as ranges (``0-7,9``); past ``shown`` ranges, the first ones and the count
    (``0,2-5,… (17)``)."""
    ranges: List[List[int]] = []
    for d in devices:
        if ranges and d == ranges[-1][1] + 1:
            ranges[-1][1] = d
        else:
            ranges.append([d, d])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges[:shown])
    return text + (f",… ({len(devices)})" if len(ranges) > shown else "")


def device_summary(values: Sequence[float]) -> Dict[str, Any]:
    """Many devices' values in brief: ``min``, ``median``, ``max`` and ``at_max`` (the devices at the max)."""
    ordered = sorted(values)
    return {"min": ordered[0], "median": statistics.median(ordered), "max": ordered[-1],
            "at_max": [d for d, v in enumerate(values) if v == ordered[-1]]}


def _summary_rows(entries: Dict[str, Any], strategies: List[str], key: str, samples: bool) -> List[List[str]]:
    """Past :data:`MAX_BARS` devices: min / median / max per strategy (the samples of the device there) and the
    devices at the max."""
    summaries = {s: device_summary(entries[s][key]) for s in strategies}

    def cell(s: str, which: str) -> str:
        value = summaries[s][which]
        device = entries[s][key].index(value) if value in entries[s][key] else None
        return f"{value:.1f}" + (f" ({entries[s]['split'][device]})" if samples and device is not None else "")

    return [[which] + [cell(s, which) for s in strategies] for which in ("min", "median", "max")] + \
        [["devices at max"] + [device_ranges(summaries[s]["at_max"]) for s in strategies]]


def format_report(report: Dict[str, Any]) -> str:
    """The report as a table at most 119 characters wide (``TABLE_WIDTH``): one row per device (peak MiB per strategy,
    its samples in parentheses; past :data:`MAX_BARS` devices min / median / max and the devices at the max), then
    max/mean, max/min, the measured step time (real devices only) and, when computed, the largest batch that fits;
    with checkpointing, a block per device of the peak without it and the saving."""
    entries = report["strategies"]
    strategies = list(entries)
    count = len(next(iter(entries.values()))["peak_mib"])

    def device_rows(key: str, samples: bool = False) -> List[List[str]]:
        if count > MAX_BARS:
            return _summary_rows(entries, strategies, key, samples)
        return [[str(d)] + [f"{entries[s][key][d]:.1f}" + (f" ({entries[s]['split'][d]})" if samples else "")
                            for s in strategies] for d in range(count)]

    blocks = [[["device" if count <= MAX_BARS else f"{count} devices"] + strategies],
              device_rows("peak_mib", samples=True)]
    fields = [("max/mean", "max_over_mean"), ("max/min", "max_over_min")]
    if all("step_s" in v for v in entries.values()):
        fields.append(("step s (measured)", "step_s"))
    if all("max_batch" in v for v in entries.values()):
        fields.append((f"max batch @ {report['config']['memory_limit']}", "max_batch"))
    blocks.append([[label] + [_cell(entries[s][key]) for s in strategies] for label, key in fields])
    if all("saving_mib" in v for v in entries.values()):
        blocks += [[["without checkpointing"] + [""] * len(strategies)] + device_rows("plain_peak_mib"),
                   [["checkpointing saves"] + [""] * len(strategies)] + device_rows("saving_mib")]
    rows = [row for block in blocks for row in block]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    rule = "  ".join("-" * w for w in widths)
    lines = []
    for block in blocks:
        lines += ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)).rstrip() for row in block] + [rule]
    c = report["config"]
    head = [f"peak memory per device, MiB (samples per device): {_title(c)}", _options(c)]
    text = "\n".join(textwrap.fill(h, TABLE_WIDTH, subsequent_indent="  ") for h in head) + "\n" + \
        "\n".join(lines[:-1])
    return text + ("\n\n" + format_advice(report) if report.get("advice") else "")


def format_advice(report: Dict[str, Any]) -> str:
    """The ``--advise`` table: per strategy x checkpointing policy the largest batch (per device) that fits the
    memory limit at the crop and the largest crop at the batch; ``<-`` marks the recommended row."""
    c = report["config"]
    rows = [["strategy", "recompute", f"max batch @ crop {c['crop_size']}", f"max crop @ batch {c['batch_size']}",
             ""]]
    for a in report["advice"]:
        rows.append([a["strategy"], a["recompute"], f"{a['max_batch']} ({a['per_device']}/device)",
                     str(a["max_crop"]), "<- recommended" if a["recommended"] else ""])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) if i < 4 else cell
                       for i, (cell, w) in enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths[:4]))
    reserve = f", {c['reserve']} of it reserved" if str(c.get("reserve", "0B")).upper() not in ("0", "0B") else ""
    head = f"advice: what fits {c['memory_limit']} per device{reserve} ({c['devices']} device(s))"
    if not any(a["max_batch"] or a["max_crop"] for a in report["advice"]):
        return (f"advice: nothing fits {c['memory_limit']} per device{reserve} ({c['devices']} device(s)): not one "
                f"sample per device at crop "
                f"{c['crop_size']}, nor a batch of {c['batch_size']} at any crop down to 8 pixels, under any "
                "strategy and checkpointing policy")
    return head + "\n" + "\n".join(lines)


def _recommendation(report: Dict[str, Any]) -> str:
    best = next((a for a in report.get("advice", []) if a["recommended"]), None)
    if best is None:
        return "nothing fits" if report.get("advice") else ""
    return (f"recommended: {best['strategy']}, --recompute {best['recompute']}, batch {best['max_batch']} "
            f"at crop {report['config']['crop_size']}")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)




def chart_figure(report: Dict[str, Any]) -> Any:
    """The chart as a matplotlib figure: grouped bars (device x strategy, MiB; beyond :data:`MAX_BARS` devices
    strategy x min / median / max, the devices at the max written above), the ``--memory-limit`` as a dashed
    line when one was given (or used by ``--max-batch``), the options (mode, ``--recompute``, ``--amp``,
    ``--calibrate``) in the title."""
    import matplotlib.pyplot as plt

    strategies = list(report["strategies"])
    count = len(report["strategies"][strategies[0]]["peak_mib"])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * (count if count <= MAX_BARS else 2 * len(strategies)) + 3), 4.4))
    if count <= MAX_BARS:
        width = 0.8 / len(strategies)
        for k, name in enumerate(strategies):
            xs = [d + (k - (len(strategies) - 1) / 2) * width for d in range(count)]
            ax.bar(xs, report["strategies"][name]["peak_mib"], width, label=name)
        ax.set_xticks(range(count))
        ax.set_xticklabels([f"device {d}" for d in range(count)])
    else:
        _summary_bars(ax, report, strategies, count)
    c = report["config"]
    if c.get("memory_limit_mib"):
        ax.axhline(c["memory_limit_mib"], color="black", linestyle="--", linewidth=1,
                   label=f"--memory-limit {c['memory_limit']}")
    ax.set_ylabel("peak memory (MiB)")
    advice = _recommendation(report)
    width = int(fig.get_figwidth() * 15)  # characters of the 8-point title that fit the figure
    lines = [_title(c), *textwrap.wrap(_options(c), width)] + ([advice] if advice else [])
    ax.set_title("\n".join(lines), fontsize=8)
    ax.legend()
    fig.tight_layout()
    return fig


def _summary_bars(ax: Any, report: Dict[str, Any], strategies: List[str], count: int) -> None:
    """Past :data:`MAX_BARS` devices: per strategy, bars of the min / median / max peak; the devices at the max
    written above it."""
    summaries = [device_summary(report["strategies"][name]["peak_mib"]) for name in strategies]
    for k, which in enumerate(("min", "median", "max")):
        xs = [i + (k - 1) * 0.27 for i in range(len(strategies))]
        bars = ax.bar(xs, [summary[which] for summary in summaries], 0.27, label=which)
        if which == "max":
            for bar, summary in zip(bars, summaries):
                ax.annotate(f"devices {device_ranges(summary['at_max'])}", (bar.get_x() + bar.get_width() / 2,
                            bar.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(strategies)))
    ax.set_xticklabels(strategies)
    ax.set_xlabel(f"{count} devices: min / median / max per strategy")


def write_chart(report: Dict[str, Any], path: str) -> bool:
    """:func:`chart_figure` as PNG; ``False`` (and a hint) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401 (installed: the chart can be drawn)
    except ImportError:
        print("matplotlib is not installed, so no chart was written; install it with: pip install matplotlib "
              "(or pip install -e '.[chart]')", file=sys.stderr)
        return False
    fig = chart_figure(report)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_figure(fig, path)
    return True


def write_json(report: Dict[str, Any], path: str) -> None:
    """Write ``report`` as indented JSON to ``path`` (atomically; its folder is created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write(path, json.dumps(report, indent=2))
