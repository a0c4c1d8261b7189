"""What a checkpoint records about its dataset, so that everything downstream needs the checkpoint alone.

A training run stores :func:`dataset_metadata` in its checkpoint's options: the class names, their colours, the
raw ignore value and, for a user's dataset class, its import path (``module:QualName``). :func:`resolve_dataset`
finds a dataset class by registry name or by that path (registering it), so ``test.py`` and
:func:`encoding.load_model` work in a fresh process. :class:`BinaryTarget` turns any dataset's masks into
foreground / background targets (``--binary-class NAME``).
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Optional, Sequence, Tuple, Type

import torch
from torch import Tensor

from ..errors import UsageError
from ..utils.palette import palette_of
from ..utils.trust import allow_import
from .transforms import IGNORE_INDEX

__all__ = ["METADATA_KEYS", "dataset_metadata", "class_path", "resolve_dataset", "BinaryTarget", "binary_class_id"]

#: The keys :func:`dataset_metadata` adds to a checkpoint's options (and a dataset object's sizes).
METADATA_KEYS = ("classes", "palette", "ignore_index", "dataset_class", "base_size", "crop_size")


def class_path(cls: type) -> str:
    """``module:QualName`` of a class (what :func:`resolve_dataset` imports)."""
    return f"{cls.__module__}:{cls.__qualname__}"


def binary_class_id(classes: Sequence[str], name: str) -> int:
    """The id of the class ``name`` (``--binary-class``).

    Raises:
        ValueError: no such class (the message lists them).
    """
    if name not in classes:
        raise UsageError(f"--binary-class {name}: not a class of the dataset; classes: {', '.join(classes)}")
    return list(classes).index(name)


def dataset_metadata(dataset: Any, binary_class: Optional[str] = None) -> Dict[str, Any]:
    """The classes, colours, raw ignore value and class path of ``dataset`` (a dataset object or class), and a
    dataset object's ``base_size`` / ``crop_size`` (the sizes it trained at), as recorded in a checkpoint; with
    ``binary_class`` the two classes ``background`` and that class."""
    classes = [str(c) for c in getattr(dataset, "CLASSES", ())]
    palette = [list(c) for c in palette_of(dataset)]
    if len(classes) != len(palette):
        classes = classes or [f"class_{i}" for i in range(len(palette))]
    if binary_class is not None:
        color = palette[binary_class_id(classes, binary_class)]
        classes, palette = ["background", binary_class], [[0, 0, 0], color if any(color) else [255, 255, 255]]
    cls = dataset if isinstance(dataset, type) else type(dataset)
    sizes = {k: getattr(dataset, k) for k in ("base_size", "crop_size") if isinstance(getattr(dataset, k, None), int)}
    return {"classes": classes, "palette": palette, "ignore_index": getattr(dataset, "ignore_value", None),
            "dataset_class": class_path(cls), **sizes}


def resolve_dataset(name: str, dataset_class: Optional[str] = None, *, trust_code: Optional[bool] = None
                    ) -> Type[Any]:
    """The dataset class registered as ``name``, else the class at ``dataset_class`` (``module:QualName``),
    registered under ``name`` (its palette too).

    A class path is data (a checkpoint's): a module outside the package is imported only when trusted
    (``encoding.utils.trust.allow_import``).

    Args:
        trust_code: ``True``: import the class's module; ``False``: refuse it; ``None``: as the enclosing
            ``encoding.utils.trust.reading`` says (outside one: imported).

    Raises:
        ValueError: neither is found (the message names both).
        UntrustedCode: the class's module is not trusted (one line naming it and the opt-in).
    """
    from . import datasets  # the registry (this module is imported by the package)

    key = name.lower()
    if key in datasets:
        return datasets[key]
    if dataset_class:
        if not isinstance(dataset_class, str):
            raise UsageError(f"dataset {name!r}: its class path must be module:QualName, got "
                             f"{str(repr(dataset_class))[:60]}")
        module, _, qualname = dataset_class.partition(":")
        allow_import(module, f"the dataset class {dataset_class!r}", trust_code)
        try:
            target: Any = importlib.import_module(module)
            for part in qualname.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as err:
            raise UsageError(f"dataset {name!r}: cannot import its class {dataset_class} ({err})") from None
        from .base import BaseDataset
        if not (isinstance(target, type) and issubclass(target, BaseDataset)):  # never call what a file names
            raise UsageError(f"dataset {name!r}: {dataset_class} is not a BaseDataset subclass")
        if any(target is registered for registered in datasets.values()):  # a built-in class, another name
            raise UsageError(f"unknown dataset {name!r}; valid names: {', '.join(sorted(datasets))}")
        from ..utils.palette import register_palettes
        datasets[key] = target
        if getattr(target, "PALETTE", None) is not None:
            register_palettes({key: target})
        return target
    raise UsageError(f"unknown dataset {name!r}; valid names: {', '.join(sorted(datasets))}")


class BinaryTarget:
    """Target transform of ``--binary-class``: 1 where the mask holds ``class_id``, 0 elsewhere, ignore kept."""

    def __init__(self, class_id: int, ignore_index: int = IGNORE_INDEX) -> None:
        self.class_id, self.ignore_index = int(class_id), int(ignore_index)

    def __call__(self, mask: Tensor) -> Tensor:
        return torch.where(mask == self.ignore_index, mask, (mask == self.class_id).to(mask.dtype))

    def __repr__(self) -> str:
        return f"BinaryTarget(class_id={self.class_id})"


def binary_setup(dataset: Any, binary_class: Optional[str]) -> Tuple[Optional[BinaryTarget], int]:
    """``(target transform, classes)`` of a binary run on ``dataset``: :class:`BinaryTarget` of ``binary_class``,
    or none when the dataset already has two classes.

    Raises:
        ValueError: no ``binary_class`` and the dataset does not have exactly two classes.
    """
    classes = list(getattr(dataset, "CLASSES", ()))
    if binary_class is not None:
        return BinaryTarget(binary_class_id(classes, binary_class)), 2
    if len(classes) != 2:
        raise UsageError(f"--binary: the dataset has {len(classes)} classes ({', '.join(classes[:6])}); binary "
                         "segmentation needs masks with two values, or --binary-class NAME")
    return None, 2
