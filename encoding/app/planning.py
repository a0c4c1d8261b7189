"""What the Plan memory tab computes, without Gradio: the memory tool's report for the options of the page.

The page's options become the command line of ``python -m encoding.memory`` (:func:`plan_argv`, shown on the page),
which the tool's own parser checks (:func:`encoding.memory.cli.parse_args`) and its own functions answer
(:func:`encoding.memory.report.memory_report`, :func:`~encoding.memory.report.format_report`,
:func:`~encoding.memory.report.write_json`, :func:`~encoding.memory.report.write_chart`): the page's numbers are the
command line's. A preset name of :data:`encoding.models.model_list` stands for its architecture, backbone, dataset and
heads. A request is checked first (:func:`check_request`): the page imports no code a request names, simulates at most
``--max-devices`` devices and plans no memory size a real device does not have; then, before any simulation, its
work (:func:`check_work`: the network's modules x strategies x passes, at most :data:`PLAN_WORK`).
"""
from __future__ import annotations

import io
import os
import shlex
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..config.fields import defaults
from ..config.tools import AppOptions
from ..errors import UsageError
from ..names import is_model_spec, names_code, names_path
from ..utils.trust import UntrustedCode
from ..models.registry import PRESETS
from ..utils.trust import reading
from .streams import routed

__all__ = ["PlanRequest", "PlanLimits", "MemoryPlanResult", "served_request", "keep_served", "PLAN_WORK",
           "plan_passes", "plan_work", "check_work", "check_request", "plan_argv", "form_defaults", "plan_memory",
           "device_rows", "advice_rows"]

@dataclass(frozen=True)
class PlanRequest:
    """The Plan memory tab's options: what ``python -m encoding.memory`` simulates. ``None`` (and ``False``) is the
    memory tool's own default, which the page does not restate (its parser fills it: ``--help``).

    Attributes:
        model: an architecture (``fcn``), a built-in model spec (``torchvision:deeplabv3_mobilenet_v3_large``) or a
            preset of :data:`encoding.models.model_list` (its backbone, dataset and heads replace those given here).
            A ``package.module:factory`` spec names code: planned only where the page's starter trusts it.
        backbone, dataset: the backbone, and the dataset whose class count and crop are the defaults.
        data_root: the folder of ``dataset="folder"`` (its classes give the class count); the page's form has no
            box for it (a visitor names no folder of the server): the Python API's and the served network's.
        aux, se_loss: the auxiliary head and the semantic-encoding loss head.
        head_channels, output_stride: the head's width and the backbone's output stride (``None``: the model's);
            the served network's, so the plan is of the network served (the form has no box for them).
        nclass, crop_size, batch_size: the class count, the crop and the batch in all.
        devices: simulated devices.
        memory_limit: memory per device (``11GiB``): the chart's line, what the advice fits.
        strategies: from :data:`encoding.config.tools.MEMORY_STRATEGIES`.
        amp: ``none`` (the tool's default), ``bf16`` or ``fp16``.
        recompute: ``none``, ``backbone`` or ``all`` (activation checkpointing).
        advise: per strategy x checkpointing policy, the largest batch and crop that fit ``memory_limit``.
        reserve: what the advice keeps free of ``memory_limit`` (``0B``: none).
        timeline: also draw each device's memory over one step, by kind (:mod:`encoding.memory.timeline`).
    """

    model: Optional[str] = None
    backbone: Optional[str] = None
    dataset: Optional[str] = None
    data_root: Optional[str] = None
    nclass: Optional[int] = None
    crop_size: Optional[int] = None
    batch_size: Optional[int] = None
    devices: Optional[int] = None
    memory_limit: Optional[str] = None
    strategies: Optional[Tuple[str, ...]] = None
    amp: Optional[str] = None
    recompute: Optional[str] = None
    advise: bool = False
    reserve: Optional[str] = None
    aux: bool = False
    se_loss: bool = False
    head_channels: Optional[int] = None
    output_stride: Optional[int] = None
    timeline: bool = False


@dataclass
class MemoryPlanResult:
    """The report (the tool's JSON), its table, the files (JSON, chart PNG; with ``timeline``, the memory of each
    device over one step: PNG and interactive HTML) and the equivalent command line."""

    report: Dict[str, Any]
    table: str
    json_path: str
    chart_path: Optional[str]
    command: str
    timeline_png: Optional[str] = None
    timeline_html: Optional[str] = None


def served_request(info: Any) -> PlanRequest:
    """The plan of a served network (its :class:`~encoding.inference.ModelInfo`): its model, backbone and heads, its
    class count and training crop, its dataset when the memory tool knows it."""
    from ..datasets import datasets

    options = info.options
    return PlanRequest(model=options.get("model"), backbone=options.get("backbone"),
                       dataset=info.dataset if info.dataset in datasets else None, nclass=info.out_channels,
                       crop_size=info.crop_size, aux=bool(options.get("aux")), se_loss=bool(options.get("se_loss")),
                       head_channels=options.get("head_channels"), output_stride=options.get("output_stride"))


def keep_served(request: PlanRequest, start: PlanRequest) -> PlanRequest:
    """``request`` with the served network's head width, output stride and data folder (``start``'s: no box of the
    form holds them) when it plans that network's model and backbone; else as it is."""
    if (request.model, request.backbone) != (start.model, start.backbone):
        return request
    return replace(request, head_channels=start.head_channels, output_stride=start.output_stride,
                   data_root=start.data_root)


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()


def _number(value: Any) -> Optional[str]:
    """A form's number as the command line writes it (``None`` / empty: not given; ``4.0`` -> ``"4"``)."""
    if value is None or value == "":
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _size(name: str, text: str, zero: bool = False) -> int:
    """A memory size of one device, in bytes: the memory tool's reader
    (:func:`encoding.memory.planner.parse_memory`, which refuses a size no real device has).

    Raises:
        UsageError: not a size, not positive, or more than any device has (one line naming the field).
    """
    from ..memory.planner import parse_memory

    if zero and text.upper() in ("0", "0B"):
        return 0
    try:
        return parse_memory(text, per_device=True)
    except ValueError as err:
        raise UsageError(f"{name}: {err}") from None


@dataclass(frozen=True)
class PlanLimits:
    """What the page plans, as its starter set it (``python -m encoding.app``).

    Attributes:
        trusted: models naming code (``package.module:factory``) whose code may be imported, or a folder of the
            server (``transformers:PATH``) that may be read: the network served (with ``--trust-code`` for code),
            the ``--plan-model``. Any other such model is refused before anything is imported or read.
        only: ``--plan-model``: the one model the tab plans (any other is refused).
        max_devices: the most simulated devices (``None``: ``--max-devices``' default).
        max_work: the most work a plan may take (:func:`check_work`; ``None``: :data:`PLAN_WORK`).
    """

    trusted: Tuple[str, ...] = ()
    only: Optional[str] = None
    max_devices: Optional[int] = None
    max_work: Optional[int] = None

    @property
    def most_devices(self) -> int:
        """``max_devices``, else the default of ``python -m encoding.app --max-devices``."""
        return defaults(AppOptions)["max_devices"] if self.max_devices is None else self.max_devices


#: The most work a plan of the page may take, in :func:`plan_work`'s units (network modules x strategies x passes):
#: about 3 minutes on 2 busy CPU cores (FCN-ResNet50, 162 modules, the six strategies with ``--recompute all``, the
#: advice and the timeline: 5,832 units, 102 s over 8 devices, 145 s over 256).
PLAN_WORK = defaults(AppOptions)["max_plan_work"]  # python -m encoding.app --max-plan-work


def plan_passes(args: Any) -> int:
    """The simulations of each strategy that the tool's options ``args`` ask for, counted as the time they take:
    1 for the table, 2 more with ``--recompute`` (the step recomputed and, for the saving, the plain one), 1 with
    ``--advise`` (its replays are cheap) and 2 with ``--timeline`` (each event recorded)."""
    return (1 + 2 * (getattr(args, "recompute", "none") not in (None, "none")) + bool(getattr(args, "advise", False))
            + 2 * bool(getattr(args, "timeline", None)))


def plan_work(args: Any) -> Tuple[int, int]:
    """``(modules, work)``: the modules of the network ``args`` plan, built on the ``meta`` device (no memory, no
    weights, no download: :meth:`~encoding.models.network.NetworkSpec.check`), and the plan's work, ``modules x
    strategies x`` :func:`plan_passes`. A simulation's time follows the network's operations (ResNeSt-269's 1,841
    modules take 7-15 times ResNet-50's 162) and the strategies and passes simulated; identical devices are
    simulated once, so the device count adds little (8 to 256 devices: 1.4 times).

    Raises:
        UsageError: the network cannot be built (one line naming its options).
    """
    from ..memory.report import step_arguments

    modules = sum(1 for _ in step_arguments(args)["network"].check().modules())
    return modules, modules * len(args.strategies) * plan_passes(args)


def check_work(args: Any, limits: PlanLimits = PlanLimits()) -> None:
    """Refuse, before anything is simulated, a plan (the tool's options ``args``) whose :func:`plan_work` is over
    ``limits.max_work`` (default :data:`PLAN_WORK`).

    Raises:
        UsageError: one line with the plan's work and what to leave out.
    """
    most = PLAN_WORK if limits.max_work is None else limits.max_work
    modules, work = plan_work(args)
    if work > most:
        raise UsageError(f"this plan's work, {modules} modules x {len(args.strategies)} strategies x "
                         f"{plan_passes(args)} passes = {work:,}, is over this page's {most:,}: plan fewer "
                         "strategies, without recompute, advise or timeline, or a smaller network (python -m "
                         "encoding.memory has no such bound)")


def check_request(request: PlanRequest, limits: PlanLimits = PlanLimits()) -> None:
    """Refuse, before the memory tool sees it, a request the page does not plan.

    Raises:
        UntrustedCode: the model names code (``package.module:factory``) its starter did not name: nothing imported.
        UsageError: another model than ``--plan-model``'s; more devices than the page simulates; a memory size that
            is not one, or that no device has (one line naming the field).
    """
    model = _text(request.model)
    if limits.only is not None and model != limits.only:
        raise UsageError(f"model {model!r}: this page plans {limits.only} only (its --plan-model)")
    if names_code(model) and model not in limits.trusted:
        raise UntrustedCode(f"model {model!r} names code to import ({model.partition(':')[0]}): this page imports no "
                            "code a request names (its starter can name it: python -m encoding.app --plan-model)")
    if names_path(model) and model not in limits.trusted:
        raise UsageError(f"model {model!r} names a folder of this server: this page reads no folder a request names "
                         "(its starter can name it: python -m encoding.app --plan-model)")
    most = limits.most_devices
    devices = _number(request.devices)
    if devices is not None and devices.lstrip("-").isdigit() and int(devices) > most:
        raise UsageError(f"devices: this page simulates at most {most} devices, got {devices} (its starter sets "
                         "--max-devices; python -m encoding.memory --simulate N has no such bound)")
    if _text(request.memory_limit):
        _size("memory limit", _text(request.memory_limit))
    if _text(request.reserve):
        _size("reserve", _text(request.reserve), zero=True)


def _option(flag: str, value: str) -> List[str]:
    """``[flag, value]``; ``flag=value`` where the value starts with ``-`` (argparse would take it for an option)."""
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


def plan_argv(request: PlanRequest, out_dir: Optional[str] = None) -> List[str]:
    """The options of ``python -m encoding.memory`` that simulate ``request`` (without ``--out-dir``); what the
    request leaves ``None`` is left to the tool's defaults. The timeline's folder is ``timeline`` (in ``out_dir``)."""
    network = dict(model=request.model, backbone=request.backbone, dataset=request.dataset, aux=request.aux,
                   se_loss=request.se_loss, head_channels=request.head_channels, output_stride=request.output_stride)
    preset = PRESETS.get(_text(request.model).lower())
    if preset is not None:
        network = dict(model=preset["name"], backbone=preset["backbone"], dataset=preset["dataset"],
                       aux=preset.get("aux", False), se_loss=preset.get("se_loss", False), head_channels=None,
                       output_stride=None)
    argv: List[str] = []  # the page's fields the tool would not read in this plan are left out (it refuses them)
    texts = [("--model", network["model"]),
             ("--backbone", None if is_model_spec(_text(network["model"])) else network["backbone"]),
             ("--dataset", network["dataset"]),
             ("--head-channels", _number(network["head_channels"])),
             ("--output-stride", _number(network["output_stride"])),
             ("--data-root", request.data_root if network["dataset"] == "folder" else None),
             ("--simulate", _number(request.devices)),
             ("--strategies", None if request.strategies is None else ",".join(request.strategies)),
             ("--recompute", request.recompute), ("--nclass", _number(request.nclass)),
             ("--crop-size", _number(request.crop_size)), ("--batch-size", _number(request.batch_size)),
             ("--memory-limit", request.memory_limit), ("--amp", None if request.amp == "none" else request.amp),
             ("--reserve", request.reserve if request.advise else None)]
    for flag, value in texts:
        if value is not None and (_text(value) or flag == "--strategies"):
            argv += _option(flag, _text(value))
    argv += ["--aux"] * bool(network["aux"]) + ["--se-loss"] * bool(network["se_loss"])
    argv += ["--timeline", os.path.join(out_dir, "timeline") if out_dir else "timeline"] * bool(request.timeline)
    return argv + ["--advise"] * bool(request.advise)


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
        with routed(stderr=err, stdout=io.StringIO()):  # this request's lines only (.streams)
            return parse_args(list(argv))
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        message = lines[-1] if lines else "the options were refused"
        raise UsageError(message.replace("python -m encoding.memory: error: ", "").replace(" (see --help)", ""))


def form_defaults(request: PlanRequest = PlanRequest()) -> Dict[str, Any]:
    """The form's first values for ``request`` (with the advice): the memory tool's own completion of it (its
    defaults, the dataset's class count and crop, two samples per device, the advice's memory limit).

    Raises:
        UsageError: the tool refuses ``request`` (its one-line message).
    """
    args = _parse(plan_argv(replace(request, advise=True)))
    return dict(model=args.model, backbone=args.backbone, dataset=args.dataset, nclass=args.nclass,
                crop_size=args.crop_size, batch_size=args.batch_size, devices=args.simulate,
                memory_limit=args.memory_limit, reserve=args.reserve, strategies=list(args.strategies),
                amp=args.amp or "none",
                recompute=args.recompute, aux=args.aux, se_loss=args.se_loss)


def plan_memory(request: PlanRequest, out_dir: str, progress: Optional[Callable[[str], None]] = None,
                limits: PlanLimits = PlanLimits()) -> MemoryPlanResult:
    """Simulate ``request`` with the memory tool and write its JSON and chart into ``out_dir``.

    Args:
        request: the options.
        out_dir: the folder of ``memory_balance.json`` / ``memory_balance.png`` (the tool's ``--out-dir``) and,
            with ``request.timeline``, of ``timeline/``.
        progress: called with each progress line of the tool (``"gather: simulated in 0.4 s"``).
        limits: what the page plans (:class:`PlanLimits`): :func:`check_request` checks the request first.

    Raises:
        UntrustedCode: a model naming code that ``limits`` does not trust (nothing is imported).
        UsageError: what :func:`check_request` refuses; options the tool refuses (its one-line message: a crop of
            0, an unknown model...); a plan over the page's work (:func:`check_work`), before any simulation.
    """
    from ..memory.cli import check_outputs
    from ..memory.report import format_report, memory_report, write_chart, write_json

    check_request(request, limits)
    # and, should anything of the request still name code, the one gate of imports refuses it (encoding.utils.trust)
    with reading("a request to the page", trust_code=_text(request.model) in limits.trusted):
        args = _parse(plan_argv(request, out_dir) + ["--out-dir", out_dir])
        check_outputs(args)  # as the tool's main: its files can be written
        if args.timeline:  # as the tool's main: the memory of one step, from the same simulation
            from ..memory.timeline import check_options, write_report_timeline
            check_options(args)
        check_work(args, limits)  # the page's bound, before any simulation
        with routed(stderr=_Lines(progress or (lambda line: None))):  # not the process's sys.stderr (.streams)
            report = memory_report(args, progress=True)
        write_json(report, args.json_path)
        with routed(stderr=io.StringIO()):
            chart = args.chart_path if write_chart(report, args.chart_path) else None
            drawn = write_report_timeline(args, report) if args.timeline else []
    command = "python -m encoding.memory " + " ".join(shlex.quote(a) for a in plan_argv(request))
    return MemoryPlanResult(report, format_report(report), args.json_path, chart, command,
                            next((p for p in drawn if p.endswith(".png")), None),
                            next((p for p in drawn if p.endswith(".html")), None))


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
    header = ["strategy", "recompute", f"max batch @ crop {config['crop_size']}", "per device",
              f"max crop @ batch {config['batch_size']}", "recommended"]
    rows = [[a["strategy"], a["recompute"], a["max_batch"], a["per_device"], a["max_crop"],
             "recommended" if a["recommended"] else ""] for a in report.get("advice", [])]
    return header, rows
