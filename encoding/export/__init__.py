"""encoding.export: a trained network as a file other runtimes run, with its metadata.

``python -m encoding.export --resume PATH --format onnx|exported`` (:mod:`.cli`); in Python
:func:`export_model` (one ``torch.export`` trace, saved as an ExportedProgram or converted to ONNX, see
:mod:`.core`). See ``docs/export.md``.
"""
from .cli import build_parser
from .core import (FORMATS, UNEXPORTABLE, ExportError, MainOutput, check_output, export_model, export_program,
                   metadata, metadata_path, save_program)
from .pooling import ExportableAdaptiveAvgPool2d, exportable_pooling

__all__ = ["FORMATS", "UNEXPORTABLE", "ExportError", "MainOutput", "export_model", "export_program", "metadata",
           "save_program", "build_parser", "check_output", "metadata_path", "ExportableAdaptiveAvgPool2d",
           "exportable_pooling"]
