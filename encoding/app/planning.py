"""What the Plan memory tab computes, without Gradio: the memory tool's report for the options of the page.

The page's options become the command line of ``python -m encoding.memory`` (:func:`plan_argv`, shown on the page),
which the tool's own parser checks (:func:`encoding.memory.cli.parse_args`) and its own functions answer
(:func:`encoding.memory.report.memory_report`, :func:`~encoding.memory.report.format_report`,
:func:`~encoding.memory.report.write_json`, :func:`~encoding.memory.report.write_chart`): the page's numbers are the
command line's. A preset name of :data:`encoding.models.model_list` stands for its architecture, backbone, dataset and
heads.
"""
from __future__ import annotations

import contextlib
import io
import os
import shlex
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import UsageError
from ..models.registry import PRESETS

__all__ = ["PlanRequest", "MemoryPlanResult", "plan_argv", "plan_memory", "device_rows", "advice_rows"]


@dataclass(frozen=True)
class PlanRequest:
    """The Plan memory tab's options: what ``python -m encoding.memory`` simulates.

    Attributes:
        model: an architecture (``fcn``), a model spec (``torchvision:deeplabv3_mobilenet_v3_large``) or a preset of
            :data:`encoding.models.model_list` (its backbone, dataset and heads replace those given here).
        backbone, dataset: the backbone, and the dataset whose class count and crop are the defaults.
        nclass, crop_size, batch_size: ``None``: the dataset's class count and crop, two samples per device.
        devices: simulated devices.
        memory_limit: memory per device (``11GiB``): the chart's line, what the advice fits; ``None``: no line.
        strategies: from :data:`encoding.config.tools.MEMORY_STRATEGIES`.
        amp: ``none``, ``bf16`` or ``fp16``.
        recompute: ``none``, ``backbone`` or ``all`` (activation checkpointing).
        advise: per strategy x checkpointing policy, the largest batch and crop that fit ``memory_limit``.
        reserve: what the advice keeps free of ``memory_limit`` (``None``: the tool's default, ``0B``: none).
    """

    model: str = "fcn"
    backbone: str = "resnet50"
    dataset: str = "pascal_voc"
    nclass: Optional[int] = None
    crop_size: Optional[int] = None
    batch_size: Optional[int] = None
    devices: int = 4
    memory_limit: Optional[str] = None
    strategies: Tuple[str, ...] = ("gather", "balanced", "balanced-auto", "ddp")
    amp: str = "none"
    recompute: str = "none"
    advise: bool = False
    reserve: Optional[str] = None


@dataclass
class MemoryPlanResult:
    """The report (the tool's JSON), its table, the files (JSON, chart PNG) and the equivalent command line."""

    report: Dict[str, Any]
    table: str
    json_path: str
    chart_path: Optional[str]
    command: str


def _number(value: Any) -> Optional[str]:
    """A form's number as the command line writes it (``None`` / empty: not given; ``4.0`` -> ``"4"``)."""
    if value is None or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def plan_argv(request: PlanRequest) -> List[str]:
    """The options of ``python -m encoding.memory`` that simulate ``request`` (without ``--out-dir``)."""
    network = dict(model=request.model, backbone=request.backbone, dataset=request.dataset, aux=False, se_loss=False)
    preset = PRESETS.get(str(request.model).strip().lower())
    if preset is not None:
        network = dict(model=preset["name"], backbone=preset["backbone"], dataset=preset["dataset"],
                       aux=preset.get("aux", False), se_loss=preset.get("se_loss", False))
    argv = ["--model", str(network["model"]).strip(), "--backbone", str(network["backbone"]).strip(),
            "--dataset", str(network["dataset"]).strip(), "--simulate", _number(request.devices) or "",
            "--strategies", ",".join(request.strategies), "--recompute", request.recompute]
    argv += ["--aux"] * bool(network["aux"]) + ["--se-loss"] * bool(network["se_loss"])
    for flag, value in (("--nclass", request.nclass), ("--crop-size", request.crop_size),
                        ("--batch-size", request.batch_size)):
        if _number(value) is not None:
            argv += [flag, _number(value)]
    if request.memory_limit and str(request.memory_limit).strip():
        argv += ["--memory-limit", str(request.memory_limit).strip()]
    if request.amp and request.amp != "none":
        argv += ["--amp", request.amp]
    if request.advise:
        argv.append("--advise")
    if request.reserve and str(request.reserve).strip():
        argv += ["--reserve", str(request.reserve).strip()]
    return argv


class _Lines(io.TextIOBase):
    """A text stream that hands each complete line to ``callback`` (the tool's progress lines to the page)."""

    def __init__(self, callback: Callable[[str], None]) -> None:
        super().__init__()
        self.callback, self.text = callback, ""

    def write(self, text: str) -> int:
        self.text += text
        while "\n" in self.text:
            line, self.text = self.text.split("\n", 1)
            if line.strip():
                self.callback(line.strip())
        return len(text)


def _parse(argv: Sequence[str]) -> Any:
    """The tool's own parse of ``argv``; its one-line error (argparse's exit 2) as a :class:`UsageError`."""
    from ..memory.cli import parse_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parse_args(list(argv))
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        message = lines[-1] if lines else "the options were refused"
        raise UsageError(message.replace("python -m encoding.memory: error: ", "").replace(" (see --help)", ""))


def plan_memory(request: PlanRequest, out_dir: str,
                progress: Optional[Callable[[str], None]] = None) -> MemoryPlanResult:
    """Simulate ``request`` with the memory tool and write its JSON and chart into ``out_dir``.

    Args:
        request: the options.
        out_dir: the folder of ``memory_balance.json`` / ``memory_balance.png`` (the tool's ``--out-dir``).
        progress: called with each progress line of the tool (``"gather: simulated in 0.4 s"``).

    Raises:
        UsageError: options the tool refuses (its one-line message: a crop of 0, an unknown model...).
    """
    from ..memory.cli import check_outputs
    from ..memory.report import format_report, memory_report, write_chart, write_json

    argv = plan_argv(request) + ["--out-dir", out_dir]
    args = _parse(argv)
    check_outputs(args)  # as the tool's main: its files can be written
    with contextlib.redirect_stderr(_Lines(progress or (lambda line: None))):
        report = memory_report(args, progress=True)
    write_json(report, args.json_path)
    with contextlib.redirect_stderr(io.StringIO()):
        chart = args.chart_path if write_chart(report, args.chart_path) else None
    command = "python -m encoding.memory " + " ".join(shlex.quote(a) for a in plan_argv(request))
    return MemoryPlanResult(report, format_report(report), args.json_path, chart, command)


def device_rows(report: Dict[str, Any]) -> Tuple[List[str], List[List[Any]]]:
    """The per-device table: ``(header, rows)``, one row per device with each strategy's peak (MiB) and its
    samples, then ``max/mean`` and ``max/min``."""
    entries = report["strategies"]
    names = list(entries)
    count = len(entries[names[0]]["peak_mib"])
    header = ["device"] + [f"{name} MiB" for name in names] + [f"{name} samples" for name in names]
    rows = [[str(d)] + [entries[n]["peak_mib"][d] for n in names] + [entries[n]["split"][d] for n in names]
            for d in range(count)]
    for label, key in (("max/mean", "max_over_mean"), ("max/min", "max_over_min")):
        rows.append([label] + [entries[n][key] for n in names] + [None] * len(names))
    return header, rows


def advice_rows(report: Dict[str, Any]) -> Tuple[List[str], List[List[Any]]]:
    """The advice (``--advise``) as ``(header, rows)``: strategy, checkpointing, the largest batch (per device) at
    the crop, the largest crop at the batch, and ``recommended`` on the recommended row; no rows without advice."""
    config = report["config"]
    header = ["strategy", "checkpoint", f"max batch @ crop {config['crop_size']}", "per device",
              f"max crop @ batch {config['batch_size']}", "recommended"]
    rows = [[a["strategy"], a["checkpoint"], a["max_batch"], a["per_device"], a["max_crop"],
             "recommended" if a["recommended"] else ""] for a in report.get("advice", [])]
    return header, rows
