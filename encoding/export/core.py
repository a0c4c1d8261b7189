"""Export a segmentation network: one ``torch.export`` trace, saved as an ExportedProgram (``.pt2``) or converted to
ONNX, with its metadata.

* :func:`export_program`: the network's main output (``B x nclass x H x W`` logits) traced by ``torch.export`` at one
  input size, or with dynamic batch / height / width;
* :func:`save_program`: the trace written as ``"exported"`` (:func:`torch.export.save`) or ``"onnx"``
  (:func:`torch.onnx.export` of the ExportedProgram, no second trace), the metadata beside it (``<file>.json``) and,
  in ONNX files, as ``metadata_props`` (each value JSON-encoded);
* :func:`export_model`: both, for a model from :func:`encoding.load_model`;
* :data:`UNEXPORTABLE`: the architectures torch cannot export, with torch's reason (checked by the tests).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..engine.loading import ModelInfo, model_info
from ..utils.files import atomic_write
from ..utils.metrics import main_output

__all__ = ["FORMATS", "SUFFIXES", "UNEXPORTABLE", "ExportError", "MainOutput", "export_program", "metadata",
           "save_program", "export_model"]

#: The export formats: ``onnx`` (an ONNX file, for onnxruntime and other runtimes) and ``exported`` (a
#: ``torch.export`` ExportedProgram, read back by :func:`torch.export.load`).
FORMATS = ("onnx", "exported")
SUFFIXES = {"onnx": ".onnx", "exported": ".pt2"}

#: Registered architectures that ``torch.export`` cannot export -> the text of torch's error (none today: every
#: architecture of :data:`encoding.models.ARCHITECTURES` exports; ``tests/test_export.py`` keeps this list true).
UNEXPORTABLE: Dict[str, str] = {}

#: The names of the exported graph's input and output.
INPUT_NAME, OUTPUT_NAME = "image", "logits"


class ExportError(RuntimeError):
    """A network torch cannot export (the message gives torch's reason), or an export that cannot be written."""


class MainOutput(nn.Module):
    """``module``'s main output only (the ``"out"`` logits; auxiliary and SE outputs are training-only)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, image: Tensor) -> Tensor:
        return main_output(self.module(image))


def export_program(model: nn.Module, input_size: Sequence[int], dynamic: bool = False,
                   name: Optional[str] = None) -> torch.export.ExportedProgram:
    """Trace ``model``'s main output with :func:`torch.export.export` on a ``1 x 3 x H x W`` input (``2 x 3 x H x W``
    with ``dynamic``, whose batch, height and width are then free).

    Args:
        model: a segmentation model in eval mode.
        input_size: ``(H, W)`` of the example input (the only accepted size unless ``dynamic``).
        dynamic: export with dynamic batch, height and width.
        name: how to name the model in errors (default: its class name).

    Raises:
        ExportError: torch cannot export the model (the message: the model and torch's reason, first line).
    """
    height, width = input_size
    device = next(model.parameters()).device
    example = torch.randn(2 if dynamic else 1, 3, height, width, device=device)
    auto = torch.export.Dim.AUTO
    shapes = ({0: auto, 2: auto, 3: auto},) if dynamic else None
    try:
        return torch.export.export(MainOutput(model).eval(), (example,), dynamic_shapes=shapes, strict=False)
    except Exception as err:  # torch raises many types (UserError, Unsupported, GuardOnDataDependent, ...)
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ExportError(f"torch.export cannot export {name or type(model).__name__}: {reason}") from err


def metadata(info: ModelInfo, fmt: str, input_size: Sequence[int], dynamic: bool) -> Dict[str, Any]:
    """What a user of the exported file needs: classes, palette, normalisation, input and output conventions."""
    height, width = input_size
    return {
        "format": fmt, "dataset": info.dataset, "classes": list(info.classes),
        "palette": [list(c) for c in info.palette], "mean": list(info.mean), "std": list(info.std),
        "input": {"name": INPUT_NAME, "shape": ["batch", 3, "height", "width"] if dynamic else [1, 3, height, width],
                  "dtype": "float32", "dynamic": dynamic, "example_size": [height, width],
                  "normalization": "(rgb / 255 - mean) / std, channels RGB"},
        "output": {"name": OUTPUT_NAME, "shape": ["batch", info.out_channels, "height", "width"],
                   "labels": f"sigmoid > {info.threshold} (one foreground channel)" if info.binary
                   else "argmax over dimension 1"},
        "ignore_index": info.ignore_index,
        "model": info.options, "crop_size": info.crop_size, "base_size": info.base_size, "torch": torch.__version__,
    }


def save_program(program: torch.export.ExportedProgram, path: str, fmt: str, meta: Dict[str, Any]) -> List[str]:
    """Write ``program`` to ``path`` in ``fmt`` and ``meta`` beside it (``<path without suffix>.json``; in ONNX files
    also as ``metadata_props``). Returns the paths written.

    Raises:
        ValueError: an unknown format.
        ExportError: the ONNX conversion failed (torch's reason).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if fmt == "exported":
        torch.export.save(program, path)
    else:
        _save_onnx(program, path, meta)
    side = os.path.splitext(path)[0] + ".json"
    atomic_write(side, json.dumps(meta, indent=2) + "\n")
    return [path, side]


def _save_onnx(program: torch.export.ExportedProgram, path: str, meta: Dict[str, Any]) -> None:
    import onnx  # the "export" extra

    try:
        onnx_program = torch.onnx.export(program, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                                         dynamo=True, verbose=False)
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ExportError(f"torch.onnx cannot convert the exported program: {reason}") from err
    proto = onnx_program.model_proto
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    onnx.save(proto, path)


def export_model(model: nn.Module, path: str, fmt: str, input_size: Optional[Tuple[int, int]] = None,
                 dynamic: bool = False) -> List[str]:
    """Export a model from :func:`encoding.load_model` (its ``model.info`` gives the metadata) to ``path``.

    Args:
        model: the network, in eval mode, with its :class:`~encoding.engine.loading.ModelInfo`.
        path: the model file (``.onnx`` / ``.pt2``); the metadata goes to ``<path without suffix>.json``.
        fmt: ``"onnx"`` or ``"exported"``.
        input_size: ``(H, W)`` of the traced input (default: the training crop).
        dynamic: dynamic batch, height and width instead of the fixed ``1 x 3 x H x W``.

    Returns:
        The paths written (the model file, the JSON metadata).

    Raises:
        ValueError: an unknown format, or a model without info. ExportError: torch cannot export it.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    info = model_info(model)
    size = tuple(input_size or (info.crop_size, info.crop_size))
    name = "-".join(str(info.options.get(k)) for k in ("model", "backbone") if info.options.get(k))
    program = export_program(model, size, dynamic, name or None)
    return save_program(program, path, fmt, metadata(info, fmt, size, dynamic))
