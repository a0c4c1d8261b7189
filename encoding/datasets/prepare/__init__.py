"""Dataset preparation, apart from loading: download, verify, extract and convert each dataset once.

``python -m encoding.datasets.prepare NAME`` is the command line (:mod:`.cli`; the ``scripts/prepare_*.py`` are thin
wrappers of it). The ``prepare_<name>`` functions and the one path they share (:func:`run_recipe`: resolve the
root, fetch, extract, check, convert) are in :mod:`.steps`; PASCAL-Context's JSON converter in :mod:`.pcontext_json`.
The dataset modules only load data; the names that moved here from them still resolve there (:data:`MOVED`).

Example:
    >>> from encoding.datasets.prepare import prepare_ade20k
    >>> prepare_ade20k("/data", mirror="/mnt/archives")  # doctest: +SKIP
"""
from typing import Any, Dict

from .cli import PREPARERS, build_parser, checksum_overrides, main, run_step, script_main
from .pcontext_json import convert_context_annotations, decode_rle
from .steps import (ADE20K_RESOURCES, CITYS_INSTRUCTIONS, CITYS_PACKAGES, COCO_RESOURCES, CONTEXT_RESOURCES,
                    RECIPES, VOC_RESOURCES, Recipe, install, prepare_ade20k, prepare_citys, prepare_coco,
                    prepare_pascal, prepare_pcontext, prepare_shapes, resolve_root, run_recipe)

__all__ = [
    "PREPARERS", "build_parser", "checksum_overrides", "run_step", "main", "script_main",
    "Recipe", "RECIPES", "resolve_root", "install", "run_recipe", "ADE20K_RESOURCES", "VOC_RESOURCES",
    "CONTEXT_RESOURCES", "COCO_RESOURCES", "CITYS_PACKAGES", "CITYS_INSTRUCTIONS",
    "prepare_ade20k", "prepare_pascal", "prepare_pcontext", "prepare_citys", "prepare_coco", "prepare_shapes",
    "decode_rle", "convert_context_annotations", "MOVED", "moved_attribute",
]

#: Dataset module -> {name it had: name here} of what moved here; its module ``__getattr__`` resolves them.
MOVED: Dict[str, Dict[str, str]] = {
    "encoding.datasets.ade20k": {"prepare_ade20k": "prepare_ade20k", "RESOURCES": "ADE20K_RESOURCES"},
    "encoding.datasets.pascal_voc": {"prepare_pascal": "prepare_pascal", "RESOURCES": "VOC_RESOURCES"},
    "encoding.datasets.pcontext": {"prepare_pcontext": "prepare_pcontext", "RESOURCES": "CONTEXT_RESOURCES",
                                   "decode_rle": "decode_rle",
                                   "convert_context_annotations": "convert_context_annotations"},
    "encoding.datasets.cityscapes": {"prepare_citys": "prepare_citys", "PACKAGES": "CITYS_PACKAGES",
                                     "INSTRUCTIONS": "CITYS_INSTRUCTIONS"},
    "encoding.datasets.coco": {"prepare_coco": "prepare_coco", "RESOURCES": "COCO_RESOURCES"},
    "encoding.datasets.shapes": {"prepare_shapes": "prepare_shapes"},
}


def moved_attribute(module: str, name: str) -> Any:
    """What ``module``'s ``name`` is now (the dataset modules' ``__getattr__`` calls this).

    Raises:
        AttributeError: ``name`` did not move here from ``module``.
    """
    if name in MOVED.get(module, {}):
        return globals()[MOVED[module][name]]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
