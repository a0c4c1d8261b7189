"""The Plan memory tab's layout: the memory tool's options in, its per-device table, chart, advice and files out
(computed by :mod:`.planning`, which runs the tool's own functions)."""
from __future__ import annotations

import tempfile
from typing import Any, List, Tuple

from ..config.tools import DEFAULT_MEMORY_LIMIT, DEFAULT_RESERVE, DEFAULT_STRATEGIES, MEMORY_STRATEGIES
from ..config.groups import AMP_CHOICES, RECOMPUTE
from .messages import on_page
from .planning import PlanRequest, advice_rows, device_rows, plan_memory

__all__ = ["SPEC_EXAMPLES", "model_choices", "dataset_sizes", "preset_network", "plan_handler", "plan_tab"]

#: Model specs offered beside the architectures and presets (any ``torchvision:NAME`` / ``module:factory`` is taken).
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
    return (f"**Recommended:** {best['strategy']}, `--recompute {best['checkpoint']}`, batch {best['max_batch']} "
            f"({best['per_device']} per device) at crop {report['config']['crop_size']}")


def dataset_sizes(dataset: str) -> Tuple[Any, Any]:
    """The class count and crop the form shows for ``dataset`` (the memory tool's defaults); unchanged for an
    unknown name (the tool names it when planning)."""
    import gradio as gr
    from ..datasets import datasets

    if dataset not in datasets:
        return gr.update(), gr.update()
    return datasets[dataset].NUM_CLASS, datasets[dataset].CROP_SIZE


def preset_network(model: str) -> Tuple[Any, Any]:
    """The backbone and dataset the form shows for a preset ``model`` (unchanged for any other model)."""
    import gradio as gr
    from ..models.registry import PRESETS

    preset = PRESETS.get(str(model or "").strip().lower())
    if preset is None:
        return gr.update(), gr.update()
    return preset["backbone"], preset["dataset"]


def plan_handler(workdir: str):
    """The function the tab calls: the options -> ``(command, table, chart, recommendation, advice, text table,
    JSON path)``; progress lines of the simulation go to the page's progress bar."""
    import gradio as gr

    @on_page
    def plan(model: str, backbone: str, dataset: str, nclass: Any, crop_size: Any, batch_size: Any, devices: Any,
             memory_limit: str, reserve: str, strategies: List[str], amp: str, recompute: str, advise: bool,
             progress: Any = gr.Progress()) -> Tuple[Any, ...]:
        request = PlanRequest(model=model or "", backbone=backbone or "", dataset=dataset or "", nclass=nclass,
                              crop_size=crop_size, batch_size=batch_size, devices=devices, memory_limit=memory_limit,
                              reserve=reserve, strategies=tuple(strategies or ()), amp=amp, recompute=recompute,
                              advise=bool(advise))
        steps = len(request.strategies) + bool(advise)
        done = [0]

        def step(line: str) -> None:
            done[0] += 1
            progress((min(done[0], steps), steps), desc=line)

        progress((0, steps), desc="simulating ...")
        result = plan_memory(request, tempfile.mkdtemp(dir=workdir), progress=step)
        header, rows = device_rows(result.report)
        advice_header, advice = advice_rows(result.report)
        return (result.command, {"headers": header, "data": rows}, result.chart_path,
                _recommendation(result.report), {"headers": advice_header, "data": advice}, result.table,
                result.json_path)

    return plan


def plan_tab(workdir: str) -> None:
    """The tab's components and events (inside a ``gradio.Blocks``)."""
    import gradio as gr
    from ..datasets import datasets
    from ..models import backbone_list

    defaults = PlanRequest()
    with gr.Row():
        with gr.Column(scale=1):
            model = gr.Dropdown(model_choices(), value=defaults.model, allow_custom_value=True, label="model",
                                info="architecture, model spec (torchvision:NAME) or preset", elem_id="plan-model")
            backbone = gr.Dropdown(backbone_list(), value=defaults.backbone, allow_custom_value=True,
                                   label="backbone", info="a preset names its own")
            dataset = gr.Dropdown(list(datasets), value=defaults.dataset, label="dataset",
                                  info="its class count and crop are the defaults")
            nclass_default, crop_default = dataset_sizes(defaults.dataset)
            with gr.Row():
                nclass = gr.Number(nclass_default, precision=0, label="classes", info="the dataset's by default")
                crop = gr.Number(crop_default, precision=0, label="crop", info="the dataset's by default")
            with gr.Row():
                batch = gr.Number(2 * defaults.devices, precision=0, label="batch", info="in all")
                devices = gr.Number(defaults.devices, precision=0, label="devices", info="simulated")
            with gr.Row():
                limit = gr.Textbox(DEFAULT_MEMORY_LIMIT, label="memory limit per device",
                                   info="11GiB, 11000MiB, 12GB; empty: no limit line", elem_id="plan-limit")
                reserve = gr.Textbox(DEFAULT_RESERVE, label="reserve", info="kept free by the advice; 0B: none",
                                     elem_id="plan-reserve")
            strategies = gr.CheckboxGroup(list(MEMORY_STRATEGIES), value=list(DEFAULT_STRATEGIES),
                                          label="strategies")
            amp = gr.Radio(list(AMP_CHOICES), value="none", label="AMP")
            recompute = gr.Radio(list(RECOMPUTE), value="none", label="recompute (activation checkpointing)")
            advise = gr.Checkbox(True, label="advise", info="what fits the limit, per strategy x recompute policy")
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
    inputs = [model, backbone, dataset, nclass, crop, batch, devices, limit, reserve, strategies, amp, recompute,
              advise]
    model.change(preset_network, [model], [backbone, dataset], api_name=False)
    dataset.change(dataset_sizes, [dataset], [nclass, crop], api_name=False)
    button.click(plan_handler(workdir), inputs, [command, table, chart, recommended, advice, text, report],
                 api_name="plan")
