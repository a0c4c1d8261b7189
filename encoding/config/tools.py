"""The options of the tools that are not scripts of ``experiments/segmentation``: the memory tool (``python -m
encoding.memory``), export (``python -m encoding.export``) and the web page (``python -m encoding.app``).

Only what is their own is a field here; what they share with ``train.py`` (``--model``, ``--backbone``,
``--dataset``, ``--aux``, ``--se-loss``, ``--crop-size``, ``--batch-size``, ``--amp``, ``--seed``, ``--recompute``,
``--resume``, ``--out-dir``) is the field of :mod:`.groups`, with the tool's own default or help in its
``per_script`` entry. Unlike the scripts' parsers, a tool's parser fills every option it is not given with its
default (there is no :func:`~.resolve.resolve` after it).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional, Tuple

from ..utils.cli import positive_int
from .fields import option

__all__ = ["TOOLS", "FORMATS", "DEFAULT_MEMORY_LIMIT", "DEFAULT_RESERVE", "MemoryOptions", "ExportOptions",
           "AppOptions", "TOOL_GROUPS"]

#: The tools whose options are fields (beside :data:`~.fields.SCRIPTS`).
#: The memory tool's strategies (``--strategies``), the default selection (``fsdp`` and ``zero1`` on request) and
#: the collective libraries a simulated rank can stand for (``--backend``); :mod:`encoding.memory.program` uses these.
MEMORY_STRATEGIES = ("gather", "balanced", "balanced-auto", "ddp", "fsdp", "zero1")
DEFAULT_STRATEGIES = MEMORY_STRATEGIES[:4]
BACKENDS = ("nccl", "gloo")
TOOLS = ("memory", "export", "app")
MEMORY = ("memory",)
EXPORT = ("export",)
APP = ("app",)
#: ``python -m encoding.export --format``: an ONNX file, or a ``torch.export`` ExportedProgram (``.pt2``).
FORMATS = ("onnx", "exported")
#: The memory size of ``--memory-limit`` when it is not given and ``--max-batch`` needs one.
DEFAULT_MEMORY_LIMIT = "11GiB"
#: What ``--advise`` keeps free of every device's ``--memory-limit`` by default: the CUDA context (300-500 MiB)
#: and the caching allocator's fragmentation, which the simulation of allocations does not see. Provisional: to be
#: replaced by what ``benchmarks/gpu_proof.py`` measures on a GPU (see docs/memory.md).
DEFAULT_RESERVE = "512MiB"


@dataclass(frozen=True)
class MemoryOptions:
    """What the memory tool simulates or measures, and where its report goes."""

    nclass: Optional[int] = option(None, "class count (default: the dataset's)", parse=positive_int, scripts=MEMORY)
    devices: Optional[str] = option(None, "CUDA devices to measure, e.g. 0,1,2,3", scripts=MEMORY)
    simulate: Optional[int] = option(None, "simulate N virtual devices on fake tensors (default: 4 when there is no "
                                     "GPU)", parse=positive_int, metavar="N", scripts=MEMORY)
    strategies: str = option(",".join(DEFAULT_STRATEGIES), f"comma-separated, from {', '.join(MEMORY_STRATEGIES)} "
                             f"(default: {','.join(DEFAULT_STRATEGIES)})", scripts=MEMORY)
    steps: int = option(1, "measured steps after one warm-up step (real devices)", parse=positive_int, scripts=MEMORY)
    keep_outputs: bool = option(False, "simulate the loop that holds the outputs through backward (outputs = "
                                "model(x); loss = criterion(outputs, y); loss.backward()); default: train.py's, which "
                                "frees them first", scripts=MEMORY)
    backend: str = option("nccl", "what the simulated ranks of fsdp communicate through: nccl (GPUs, in place; "
                          "default) or gloo (CPU processes: each all-gather and reduce-scatter is staged in a buffer "
                          "of its own)", choices=BACKENDS, scripts=MEMORY)
    calibrate: bool = option(False, "learn the kernels' workspaces that fake tensors miss from real steps of 1, S "
                             "and S+1 samples on the real device (a GPU where there is one, S=1; else the CPU, S its "
                             "intra-op threads, at least 2)", scripts=MEMORY)
    max_batch: bool = option(False, "also find, per strategy, the largest total batch that fits --memory-limit "
                             "(simulated)", scripts=MEMORY)
    advise: bool = option(False, "per strategy x recomputation policy (none, backbone, all): the largest batch that "
                          "fits --memory-limit at the crop and the largest crop at the batch; marks the recommended "
                          "one", scripts=MEMORY)
    memory_limit: Optional[str] = option(
        None, "memory per device with its unit (11GiB, 11000MiB, 12GB; a bare number is an error): --max-batch and "
        f"--advise search under it (default there: {DEFAULT_MEMORY_LIMIT}), the chart draws it as a line",
        metavar="SIZE", scripts=MEMORY)
    reserve: str = option(DEFAULT_RESERVE, "what --advise keeps free of --memory-limit for the CUDA context and "
                          "fragmentation, which the simulation does not count (default: "
                          f"{DEFAULT_RESERVE}, provisional; 0B: none)", metavar="SIZE", scripts=MEMORY)
    json: Optional[str] = option(None, "JSON report (default: OUT_DIR/memory_balance.json)", metavar="PATH",
                                 scripts=MEMORY)
    chart: Optional[str] = option(None, "PNG chart (default: OUT_DIR/memory_balance.png)", metavar="PATH",
                                  scripts=MEMORY)
    timeline: Optional[str] = option(None, "also draw each device's memory over one simulated step, stacked by kind "
                                     "(timeline.png, timeline.html, timeline.json in DIR)", metavar="DIR",
                                     scripts=MEMORY)


@dataclass(frozen=True)
class ExportOptions:
    """What export writes (the network: ``--resume``)."""

    format: Optional[str] = option(None, "onnx: an ONNX file (onnxruntime); exported: a torch.export ExportedProgram (.pt2) "
                                   "(default: by --output's suffix, else onnx)", choices=FORMATS, scripts=EXPORT)
    output: Optional[str] = option(None, "the model file (default: beside the checkpoint, a Hub id's or preset's "
                                   "in the current folder; model.onnx / model.pt2); metadata: FILE's name with .json",
                                   metavar="FILE", scripts=EXPORT)
    input_size: Optional[Tuple[int, int]] = option(None, "the traced input size (default: the checkpoint's training "
                                                   "crop)", parse=positive_int, nargs=2, metavar=("H", "W"),
                                                   scripts=EXPORT)
    static: bool = option(False, "fix the traced shape 1 x 3 x H x W (default: dynamic batch, height and width, "
                          "checked against the eager network at another size)", scripts=EXPORT)
    dynamic: bool = option(False, "no-op, kept for old command lines: dynamic is the default (--static fixes the "
                           "shape)", scripts=EXPORT)


def port_number(text: str) -> int:
    """``--port``: a TCP port, 1 to 65535."""
    port = positive_int(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 1 to 65535, got {text!r}")
    return port


@dataclass(frozen=True)
class AppOptions:
    """The web page's network (``--resume`` or ``--model``), where it listens and what it accepts."""

    model_source: Optional[str] = option(None, "a save_pretrained folder, a Hugging Face id user/repo or a preset name "
                                         "of encoding.models.model_list (instead of --resume)", flags=("--model",),
                                         metavar="DIR_OR_PRESET", scripts=APP)
    host: str = option("127.0.0.1", "the address to listen on (default: this machine only; 0.0.0.0 serves the "
                       "network)", scripts=APP)
    port: int = option(7860, "the TCP port", parse=port_number, scripts=APP)
    device: Optional[str] = option(None, "where the network runs, e.g. cpu or cuda:0 (default: cuda when there is "
                                   "a GPU, else cpu)", scripts=APP)
    plan_model: Optional[str] = option(None, "the one network the Plan memory tab plans, e.g. your "
                                       "package.module:factory (a request naming code is refused otherwise)",
                                       metavar="MODEL", scripts=APP)
    max_devices: int = option(256, "the most devices the Plan memory tab simulates", parse=positive_int,
                              metavar="N", scripts=APP)
    max_plan_work: int = option(8000, "the most work one plan of the Plan memory tab may take: the network's "
                                "modules x strategies x passes (docs/app.md)", parse=positive_int, metavar="N",
                                scripts=APP)
    concurrency_limit: int = option(1, "requests computed at the same time (Gradio's concurrency_limit)",
                                    parse=positive_int, metavar="N", scripts=APP)
    max_queue: int = option(16, "requests waiting beyond those; more are refused with a message (Gradio's "
                            "max_size)", parse=positive_int, metavar="N", scripts=APP)


#: The tools' own groups, by ``--help`` section name.
TOOL_GROUPS = {"memory": MemoryOptions, "export": ExportOptions, "app": AppOptions}
