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

import argparse
import contextlib
import inspect
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.export.graph_signature import ExportGraphSignature, InputKind

from ..config.tools import FORMATS
from ..errors import EncodingError, MissingDependency, UsageError
from ..inference.loading import ModelInfo, model_info
from ..inference.sources import input_files
from ..names import network_name
from ..utils.cli import positive_int
from ..utils.files import atomic_path, atomic_write, refuse_own_input
from ..utils.images import max_pixels
from ..utils.metrics import main_output
from .pooling import exportable_pooling

__all__ = ["FORMATS", "SUFFIXES", "UNEXPORTABLE", "ExportError", "MainOutput", "export_program", "metadata",
           "save_program", "export_model", "check_output", "metadata_path", "check_format_installed", "traced_size"]

#: The file suffix of each export format of :data:`~encoding.config.tools.FORMATS`: ``onnx`` (an ONNX file, for
#: onnxruntime and other runtimes) and ``exported`` (a ``torch.export`` ExportedProgram, read back by
#: :func:`torch.export.load`).
SUFFIXES = {"onnx": ".onnx", "exported": ".pt2"}

#: Registered architectures that ``torch.export`` cannot export -> the text of torch's error (none today: every
#: architecture of :data:`encoding.models.ARCHITECTURES` exports; ``tests/test_export.py`` keeps this list true).
UNEXPORTABLE: Dict[str, str] = {}

#: The names of the exported graph's input and output.
INPUT_NAME, OUTPUT_NAME = "image", "logits"


class ExportError(RuntimeError, EncodingError):
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
    with ``dynamic``, whose batch, height and width are then free: adaptive average pooling is then traced as
    :class:`~.pooling.ExportableAdaptiveAvgPool2d`, which ONNX runs right at every size).

    The program holds only what the main output needs: the auxiliary and SE branches (computed by the forward,
    unused by ``logits``) are removed with their weights as dead code. ``model`` is traced in eval mode and left in
    the mode each of its modules was in.

    Args:
        model: a segmentation model.
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
    with _eval_mode(model):
        traced = MainOutput(exportable_pooling(model) if dynamic else model).eval()
        try:
            program = torch.export.export(traced, (example,), dynamic_shapes=shapes, strict=False)
            return _without_dead_code(program.run_decompositions({}))  # no decomposition: the dead code removed
        except Exception as err:  # torch raises many types (UserError, Unsupported, GuardOnDataDependent, ...)
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ExportError(f"torch.export cannot export {name or type(model).__name__}: {reason}") from err


def _without_dead_code(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` without the nodes no output needs, and without the parameters and buffers no node reads: the
    auxiliary and SE heads (their weights too), which the forward computes and :class:`MainOutput` drops."""
    module, signature = program.graph_module, program.graph_signature
    module.graph.eliminate_dead_code()
    placeholders = {node.name: node for node in module.graph.nodes if node.op == "placeholder"}
    unused = [spec for spec in signature.input_specs if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER)
              and not placeholders[spec.arg.name].users]
    if not unused or "verifiers" not in inspect.signature(torch.export.ExportedProgram).parameters:
        return program  # (an older torch's constructor: the dead weights stay in the file, the dead code is gone)
    for spec in unused:
        module.graph.erase_node(placeholders[spec.arg.name])
    module.recompile()
    dropped = {spec.target for spec in unused}
    kept = ExportGraphSignature([spec for spec in signature.input_specs if spec not in unused],
                                list(signature.output_specs))
    return torch.export.ExportedProgram(
        root=module, graph=module.graph, graph_signature=kept,
        state_dict={k: v for k, v in program.state_dict.items() if k not in dropped},
        range_constraints=program.range_constraints, module_call_graph=program.module_call_graph,
        example_inputs=program.example_inputs, constants=program.constants, verifiers=[program.verifier])


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside the block; after it, each module back in the mode it was in."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def metadata(info: ModelInfo, fmt: str, input_size: Sequence[int], dynamic: bool) -> Dict[str, Any]:
    """What a user of the exported file needs: classes, palette, normalisation, input and output conventions."""
    height, width = input_size
    return {
        "format": fmt, "dataset": info.dataset, "classes": list(info.classes),
        "palette": [list(c) for c in info.palette], "mean": list(info.mean), "std": list(info.std),
        "input": {"name": INPUT_NAME, "shape": ["batch", 3, "height", "width"] if dynamic else [1, 3, height, width],
                  "dtype": "float32", "dynamic": dynamic, "example_size": [height, width],
                  "normalization": "(rgb / 255 - mean) / std, channels RGB"},
        "output": {"name": OUTPUT_NAME,
                   "shape": ["batch", info.out_channels, "height", "width"] if dynamic else
                   [1, info.out_channels, height, width],
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
    return _write(program, path, fmt, meta)


def metadata_path(path: str) -> str:
    """Where the metadata of the model file ``path`` goes: ``<path without suffix>.json``."""
    return os.path.splitext(path)[0] + ".json"


def check_output(path: str, inputs: Sequence[Optional[str]] = (), option: str = "--output") -> None:
    """Refuse an export ``path`` whose model file or metadata would be the same file, or one of ``inputs``.

    Args:
        path: the model file to write (its metadata: :func:`metadata_path`).
        inputs: the files the export read (its checkpoint, a model folder's files).
        option: how the message names ``path`` (the command's ``--output``, Python's ``export_model path``).

    Raises:
        UsageError: one line naming the path.
    """
    if os.path.splitext(path)[1].lower() == ".json":
        raise UsageError(f"{option} {path}: the metadata is written to <name>.json beside the model file, so the "
                         "model file cannot be a .json file (e.g. model.onnx / model.pt2)")
    refuse_own_input([path, metadata_path(path)], list(inputs), option)


def _write(program: torch.export.ExportedProgram, path: str, fmt: str, meta: Dict[str, Any],
           verify: Optional[Any] = None) -> List[str]:
    """Write the model file and its metadata, each atomically (a failure leaves any earlier export as it was);
    ``verify(tmp_path)`` runs on the finished model file before it replaces ``path``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    check_output(path)
    with atomic_path(path) as tmp:
        if fmt == "exported":
            torch.export.save(program, tmp)
        else:
            _save_onnx(program, tmp, meta)
        if verify is not None:
            verify(tmp)
    side = metadata_path(path)
    atomic_write(side, json.dumps(meta, indent=2) + "\n")
    return [path, side]


def check_format_installed(fmt: str) -> None:
    """Refuse ``fmt`` when what writes and checks it is not installed: ONNX needs ``onnx`` and ``onnxscript`` to
    write it and ``onnxruntime`` to check a dynamic export at another size (the extra ``export`` ships all three),
    checked before any trace.

    Raises:
        MissingDependency: one line naming the package and the extra to install.
    """
    if fmt != "onnx":
        return
    for package in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(package)
        except ImportError:
            raise MissingDependency(f"--format onnx needs the package {package}: pip install 'encoding[export]' "
                                    "(or --format exported, which needs only torch)") from None


def _save_onnx(program: torch.export.ExportedProgram, path: str, meta: Dict[str, Any]) -> None:
    check_format_installed("onnx")
    import onnx  # the "export" extra

    try:
        onnx_program = torch.onnx.export(program, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                                         dynamo=True, verbose=False)
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ExportError(f"torch.onnx cannot convert the exported program: {reason}") from err
    proto = onnx_program.model_proto
    _name_axes(proto, meta["input"]["shape"])
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, json.dumps(value)
    onnx.save(proto, path)


def _name_axes(proto: Any, shape: Sequence[Any]) -> None:
    """Give the input's free axes the names of the metadata's ``shape`` (``batch``, ``height``, ``width``) in the whole
    ONNX graph, where torch names them after its symbols (``s0``, ...)."""
    names = {}
    for dim, name in zip(proto.graph.input[0].type.tensor_type.shape.dim, shape):
        if isinstance(name, str) and dim.dim_param:
            names[dim.dim_param] = name
    for value in [*proto.graph.input, *proto.graph.output, *proto.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]


#: The tolerance of the check of a dynamic export at another input size: ``|file - eager| <= TOLERANCE *
#: max(1, max |eager|)``.
TOLERANCE = 1e-4


def _other_size(size: Sequence[int]) -> Tuple[int, int, int, int]:
    """The input of the check of a dynamic export: another batch and another height and width than the traced."""
    height, width = size
    return 3, 3, height + 32, width + 16


def _verifier(model: nn.Module, fmt: str, size: Sequence[int], name: str) -> Any:
    """``verify(path)`` of :func:`_write` for a dynamic export: the written file at another batch and size must give
    the eager model's logits, else :class:`ExportError` (nothing is written). ONNX files are run by onnxruntime
    (required for ONNX exports: :func:`check_format_installed`)."""
    image = torch.randn(*_other_size(size), generator=torch.Generator().manual_seed(0))
    device = next(model.parameters()).device

    def verify(path: str) -> None:
        with torch.no_grad():
            eager = main_output(model(image.to(device))).float().cpu()
            got = _run_file(path, fmt, image.to(device))
        bound = TOLERANCE * max(1.0, eager.abs().max().item())
        error = (got.float().cpu() - eager).abs().max().item() if got.shape == eager.shape else float("inf")
        if not error <= bound:
            raise ExportError(f"the dynamic {fmt} export of {name} gives logits off by {error:.3g} at input "
                              f"{list(image.shape)} (traced at {list(size)}); nothing was written: export it "
                              "with --static, at the size it will run at")
    return verify


def _run_file(path: str, fmt: str, image: Tensor) -> Tensor:
    """The logits of the exported file at ``path`` for ``image`` (an ONNX file run by onnxruntime)."""
    try:
        if fmt == "exported":
            return torch.export.load(path).module()(image)
        import onnxruntime  # the "export" extra (check_format_installed)

        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        return torch.from_numpy(session.run(None, {INPUT_NAME: image.cpu().numpy()})[0])
    except ExportError:
        raise
    except Exception as err:  # a guard of the trace, or the runtime refusing the shape
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ExportError(f"the dynamic {fmt} export fails at input {list(image.shape)}: {reason}; nothing "
                          "was written: export it with --static, at the size it will run at") from None


def traced_size(info: ModelInfo, input_size: Optional[Sequence[int]], name: str) -> Tuple[int, int]:
    """The ``(H, W)`` to trace at: ``input_size``, else the training crop ``info`` records; its pixels under the
    pixel limit (:func:`~encoding.utils.images.max_pixels`: the example input and the activations are allocated).

    Raises:
        UsageError: no size (a model that records no crop size: one line asking for ``--input-size H W``), or
            ``H x W`` over the pixel limit (one line).
    """
    if input_size is None and info.crop_size is None:
        raise UsageError(f"export of {name}: the model records no training crop size to trace at; give one with "
                         "--input-size H W (input_size=(H, W) in Python)")
    height, width = _checked_size(input_size) if input_size is not None else (info.crop_size, info.crop_size)
    if height * width > max_pixels():
        raise UsageError(f"--input-size {height} {width}: {height * width:,} pixels is over the pixel limit of "
                         f"{max_pixels():,} (the example input and the network's activations are allocated at that "
                         "size; raise the limit with ENCODING_MAX_PIXELS)")
    return height, width


def _checked_size(input_size: Any) -> Tuple[int, int]:
    """``input_size`` as ``(H, W)``, each checked by the command line's own ``--input-size`` rule
    (:func:`~encoding.utils.cli.positive_int` of its text: ``32.5``, ``0``, ``True`` are refused).

    Raises:
        UsageError: one line naming ``input_size`` and its value.
    """
    try:
        if isinstance(input_size, (str, bytes)) or len(input_size) != 2:
            raise argparse.ArgumentTypeError("expected two numbers, (H, W)")
        return positive_int(str(input_size[0])), positive_int(str(input_size[1]))
    except (TypeError, argparse.ArgumentTypeError) as err:
        raise UsageError(f"input_size {str(repr(input_size))[:60]}: {err} (the traced (H, W): two positive whole "
                         "numbers of pixels; --input-size H W)") from None


def export_model(model: nn.Module, path: str, fmt: str, input_size: Optional[Tuple[int, int]] = None,
                 dynamic: bool = False, inputs: Sequence[Optional[str]] = ()) -> List[str]:
    """Export a model from :func:`encoding.load_model` (its ``model.info`` gives the metadata) to ``path``.

    Args:
        model: the network, with its :class:`~encoding.inference.loading.ModelInfo` (exported in eval mode, and
            left in the mode it was in).
        path: the model file (``.onnx`` / ``.pt2``); the metadata goes to ``<path without suffix>.json``.
        fmt: ``"onnx"`` or ``"exported"``.
        input_size: ``(H, W)`` of the traced input (default: the training crop).
        dynamic: dynamic batch, height and width instead of the fixed ``1 x 3 x H x W``; the written file is then
            checked against the eager model at another batch and size before it replaces ``path``.
        inputs: files the export reads (the checkpoint): neither file written may be one of them, nor one of
            the files :func:`encoding.load_model` read ``model`` from (recorded on it:
            :func:`~encoding.inference.sources.input_files`).

    Returns:
        The paths written (the model file, the JSON metadata), each atomically.

    Raises:
        ValueError: an unknown format, a model without info, or an output path that is an input, a directory or
            the metadata's own path (``.json``); no ``input_size`` for a model that records no crop size, one that
            is not two positive ints, or one over the pixel limit (:class:`UsageError`, one line).
            MissingDependency: ``onnx`` without the ``export`` extra (onnx, onnxscript, onnxruntime; before any
            trace).
            ExportError: torch cannot export it, or a dynamic export that differs from the eager model at another
            size (nothing written).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    check_output(path, [*inputs, *input_files(model)], "export_model path")
    check_format_installed(fmt)
    info = model_info(model)
    name = network_name(str(info.options.get("model") or ""), info.options.get("backbone"))
    size = traced_size(info, input_size, name or type(model).__name__)
    with _eval_mode(model):  # the check of a dynamic export compares with the eager model in eval mode too
        program = export_program(model, size, dynamic, name or None)
        verify = _verifier(model, fmt, size, name or type(model).__name__) if dynamic else None
        return _write(program, path, fmt, metadata(info, fmt, size, dynamic), verify)
