"""The files a model was read from: :func:`~encoding.inference.loading.load_model` records them on the model it
returns, and the writers of this package (:func:`encoding.export.export_model`,
:func:`~encoding.inference.hub.save_pretrained`) refuse to write over any of them.

The record is a plain attribute of the model object (:data:`SOURCES_ATTRIBUTE`): not a parameter or buffer, so in no
state dict, and not part of :class:`~encoding.inference.loading.ModelInfo`, so in no saved config or metadata.
"""
from __future__ import annotations

import os
from typing import Iterable, List, Optional

from torch import nn

__all__ = ["SOURCES_ATTRIBUTE", "record_sources", "input_files"]

#: The attribute of a loaded model that holds the absolute paths of the files it was read from.
SOURCES_ATTRIBUTE = "_encoding_sources"


def record_sources(model: nn.Module, paths: Iterable[Optional[str]]) -> nn.Module:
    """Record ``paths`` (``None`` entries skipped) as the files ``model`` was read from; returns ``model``."""
    object.__setattr__(model, SOURCES_ATTRIBUTE, tuple(os.path.abspath(os.fspath(p)) for p in paths if p is not None))
    return model


def input_files(model: nn.Module) -> List[str]:
    """The files ``model`` was read from (its checkpoint, its shared folder's files, the folder of the
    ``transformers:PATH`` network it was built from), looked up through ``torch.compile`` / ``DataParallel``
    wrappers; ``[]`` for a model built in Python."""
    while True:
        sources = model.__dict__.get(SOURCES_ATTRIBUTE)
        if sources is not None:
            return list(sources)
        children = model.__dict__.get("_modules", {})
        inner = children.get("_orig_mod") or children.get("module")  # torch.compile's, DataParallel's
        if not isinstance(inner, nn.Module):
            return []
        model = inner
