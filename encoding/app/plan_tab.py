"""The Plan memory tab's layout: the memory tool's options in, its per-device table, chart, advice and files out
(computed by :mod:`.planning`, which runs the tool's own functions)."""
from __future__ import annotations

from typing import Any, List, Tuple

from ..config.groups import AMP_CHOICES, RECOMPUTE_POLICIES
from ..config.tools import MEMORY_STRATEGIES
from ..errors import UsageError
from .messages import COMPUTE, on_page
from .planning import (PlanLimits, PlanRequest, advice_rows, device_rows, form_defaults, keep_served,
                       plan_memory)
from .workfiles import work_folders

__all__ = ["SPEC_EXAMPLES", "model_choices", "dataset_sizes", "preset_network", "plan_handler", "plan_tab"]

#: Model specs offered beside the architectures and presets (any ``torchvision:NAME`` / ``transformers:PATH`` is taken;
#: a ``module:factory`` only where the page's starter named it).
SPEC_EXAMPLES = ("torchvision:deeplabv3_mobilenet_v3_large", "torchvision:lraspp_mobilenet_v3_large",
                 "torchvision:fcn_resnet50")


def model_choices() -> List[str]:
    """The model menu: the registered architectures, some model specs, then the presets."""
    from ..models import ARCHITECTURES, model_list

    return list(ARCHITECTURES) + list(SPEC_EXAMPLES) + list(model_list)


def _recommendation(report: dict) -> str:
    best = next((a for a in report.get("advice", []) if a["recommended"]), None)
    if best is None:
        return "**Advice:** nothing fits the limit." if report.get("advice") else ""
    return (f"**Recommended:** {best['strategy']}, `--recompute {best['recompute']}`, batch {best['max_batch']} "
            f"({best['per_device']} per device) at crop {report['config']['crop_size']}")


def dataset_sizes(dataset: str) -> Tuple[Any, Any]:
    """The class count and crop the form shows for ``dataset`` (the memory tool's defaults); unchanged for an
    unknown name (the tool names it when planning)."""
    import gradio as gr
    from ..datasets import datasets

    if dataset not in datasets:
        return gr.update(), gr.update()
    return datasets[dataset].NUM_CLASS, datasets[dataset].CROP_SIZE


def preset_network(model: str) -> Tuple[Any, ...]:
    """The backbone, dataset and heads the form shows for a preset ``model`` (unchanged for any other model)."""
    import gradio as gr
    from ..models.registry import PRESETS

    preset = PRESETS.get(str(model or "").strip().lower())
    if preset is None:
        return gr.update(), gr.update(), gr.update(), gr.update()
    return preset["backbone"], preset["dataset"], bool(preset.get("aux")), bool(preset.get("se_loss"))


def plan_handler(workdir: str, limits: PlanLimits = PlanLimits(), start: PlanRequest = PlanRequest()):
    """The function the tab calls: the options -> ``(command, table, chart, recommendation, advice, text table,
    JSON path, timeline PNG, timeline HTML)``; progress lines of the simulation go to the page's progress bar.
    ``limits``: what the page plans (:class:`~.planning.PlanLimits`: a model naming code is refused unless its
    starter named it). ``start``: the served network's request, whose head width, output stride and data folder (no
    box of the form holds them) a plan of that model and backbone keeps."""
    import gradio as gr

    @on_page
    def plan(model: str, backbone: str, dataset: str, nclass: Any, crop_size: Any, batch_size: Any, devices: Any,
             memory_limit: str, reserve: str, strategies: List[str], amp: str, recompute: str, advise: bool,
             aux: bool = False, se_loss: bool = False, timeline: bool = False,
             progress: Any = gr.Progress()) -> Tuple[Any, ...]:
        request = PlanRequest(model=model or None, backbone=backbone or None, dataset=dataset or None, nclass=nclass,
                              crop_size=crop_size, batch_size=batch_size, devices=devices,
                              memory_limit=memory_limit, reserve=reserve, strategies=tuple(strategies or ()),
                              amp=amp or None, recompute=recompute or None, advise=bool(advise), aux=bool(aux),
                              se_loss=bool(se_loss), timeline=bool(timeline))
        request = keep_served(request, start)
        steps = len(request.strategies) + bool(advise) + bool(timeline)
        done = [0]

        def step(line: str) -> None:
            done[0] += 1
            progress((min(done[0], steps), steps), desc=line)

        progress((0, steps), desc="simulating ...")
        with work_folders(workdir).request() as folder:  # removed if refused (.workfiles)
            result = plan_memory(request, folder, progress=step, limits=limits)
        header, rows = device_rows(result.report)
        advice_header, advice = advice_rows(result.report)
        return (result.command, {"headers": header, "data": rows}, result.chart_path,
                _recommendation(result.report), {"headers": advice_header, "data": advice}, result.table,
                result.json_path, result.timeline_png, result.timeline_html)

    return plan


def plan_tab(workdir: str, start: PlanRequest = PlanRequest(), limits: PlanLimits = PlanLimits()) -> None:
    """The tab's components and events (inside a ``gradio.Blocks``).

    Args:
        workdir: where each plan's report files go.
        start: the plan the form starts on (the served network's, :func:`~.planning.served_request`; by default the
            memory tool's defaults), completed by the tool (:func:`~.planning.form_defaults`; the tool's defaults where
            it refuses the served network).
        limits: what the page plans; with ``limits.only`` the model box holds that model alone.

    Raises:
        UsageError: the memory tool refuses ``limits.only`` (``--plan-model``), when the page is built.
    """
    import gradio as gr
    from ..datasets import datasets
    from ..models import backbone_list

    try:
        values = form_defaults(start)
    except UsageError:  # a served network the memory tool cannot build: its defaults; a bad --plan-model: refused
        if limits.only is not None:
            raise
        values = form_defaults()
    fixed = limits.only is not None
    with gr.Row():
        with gr.Column(scale=1):
            model = gr.Dropdown([limits.only] if fixed else model_choices(), value=values["model"],
                                allow_custom_value=not fixed, interactive=not fixed, label="model",
                                info="the page's network (--plan-model)" if fixed else
                                "architecture, built-in model spec (torchvision:NAME) or preset; no module:factory "
                                "code", elem_id="plan-model")
            backbone = gr.Dropdown(backbone_list(), value=values["backbone"], allow_custom_value=True,
                                   label="backbone", info="a preset names its own")
            dataset = gr.Dropdown(list(datasets), value=values["dataset"], label="dataset",
                                  info="its class count and crop are the defaults")
            with gr.Row():
                nclass = gr.Number(values["nclass"], precision=0, label="classes", info="the dataset's by default")
                crop = gr.Number(values["crop_size"], precision=0, label="crop", info="the dataset's by default")
            with gr.Row():
                batch = gr.Number(values["batch_size"], precision=0, label="batch", info="in all")
                devices = gr.Number(values["devices"], precision=0, label="devices",
                                    info=f"simulated, at most {limits.most_devices}")
            with gr.Row():
                limit = gr.Textbox(values["memory_limit"], label="memory limit per device",
                                   info="11GiB, 11000MiB, 12GB; empty: no limit line", elem_id="plan-limit")
                reserve = gr.Textbox(values["reserve"], label="reserve", info="kept free by the advice; 0B: none",
                                     elem_id="plan-reserve")
            strategies = gr.CheckboxGroup(list(MEMORY_STRATEGIES), value=values["strategies"], label="strategies")
            amp = gr.Radio(list(AMP_CHOICES), value=values["amp"], label="AMP")
            recompute = gr.Radio(list(RECOMPUTE_POLICIES), value=values["recompute"],
                                 label="recompute (activation checkpointing)")
            with gr.Row():
                aux = gr.Checkbox(values["aux"], label="aux head")
                se_loss = gr.Checkbox(values["se_loss"], label="SE loss head")
            advise = gr.Checkbox(True, label="advise", info="what fits the limit, per strategy x recompute policy")
            timeline = gr.Checkbox(False, label="timeline", info="each device's memory over one step, by kind")
            button = gr.Button("Plan", variant="primary", elem_id="plan-run")
        with gr.Column(scale=2):
            command = gr.Textbox(label="the same on the command line", interactive=False, elem_id="plan-command")
            table = gr.Dataframe(label="peak memory per device (MiB) and samples per device", interactive=False,
                                 elem_id="plan-table")
            chart = gr.Image(type="filepath", label="chart", interactive=False, elem_id="plan-chart")
            recommended = gr.Markdown(elem_id="plan-recommended")
            advice = gr.Dataframe(label="advice", interactive=False, elem_id="plan-advice")
            text = gr.Code(label="the memory tool's table", language=None, interactive=False, elem_id="plan-text")
            report = gr.File(label="report (JSON)", interactive=False)
            timeline_png = gr.Image(type="filepath", label="memory over one step (timeline)", interactive=False,
                                    elem_id="plan-timeline")
            timeline_html = gr.File(label="timeline (interactive HTML)", interactive=False)
    inputs = [model, backbone, dataset, nclass, crop, batch, devices, limit, reserve, strategies, amp, recompute,
              advise, aux, se_loss, timeline]
    model.change(preset_network, [model], [backbone, dataset, aux, se_loss], api_name=False)
    dataset.change(dataset_sizes, [dataset], [nclass, crop], api_name=False)
    outputs = [command, table, chart, recommended, advice, text, report, timeline_png, timeline_html]
    button.click(plan_handler(workdir, limits, start), inputs, outputs, api_name="plan", concurrency_id=COMPUTE)
