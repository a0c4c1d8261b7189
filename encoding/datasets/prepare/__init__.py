"""Dataset preparation, apart from loading: download, verify, extract and convert each dataset once.

``python -m encoding.datasets.prepare NAME`` is the command line (:mod:`.cli`; the ``scripts/prepare_*.py`` are thin
wrappers of it). The ``prepare_<name>`` functions and the one path they share (:func:`run_recipe`: resolve the
root, fetch, extract, check, convert) are in :mod:`.steps`; fetching (:func:`~.download.download`,
:func:`~.download.extract`) in :mod:`.download`; the conversions in :mod:`.coco_masks` (COCO's instances),
:mod:`.sbd` (SBD's ``.mat`` labels) and :mod:`.pcontext_json` (PASCAL-Context's JSON); the generated ``shapes``
dataset in :mod:`.shapes_render`. Nothing here imports a dataset class: the folder names both sides use are in
:mod:`encoding.datasets.layout`.

Example:
    >>> from encoding.datasets.prepare import prepare_ade20k
    >>> prepare_ade20k("/data", mirror="/mnt/archives")  # doctest: +SKIP
"""
from .cli import PREPARERS, build_parser, checksum_overrides, main, run_step, script_main
from .download import DownloadError, Resource, download, extract, fetch_resources
from .pcontext_json import convert_context_annotations, decode_rle
from .steps import (ADE20K_RESOURCES, CITYS_INSTRUCTIONS, CITYS_PACKAGES, COCO_RESOURCES, CONTEXT_RESOURCES,
                    RECIPES, VOC_RESOURCES, Recipe, install, prepare_ade20k, prepare_citys, prepare_coco,
                    prepare_pascal, prepare_pcontext, prepare_shapes, resolve_root, run_recipe)

__all__ = [
    "PREPARERS", "build_parser", "checksum_overrides", "run_step", "main", "script_main",
    "Recipe", "RECIPES", "resolve_root", "install", "run_recipe", "ADE20K_RESOURCES", "VOC_RESOURCES",
    "CONTEXT_RESOURCES", "COCO_RESOURCES", "CITYS_PACKAGES", "CITYS_INSTRUCTIONS",
    "prepare_ade20k", "prepare_pascal", "prepare_pcontext", "prepare_citys", "prepare_coco", "prepare_shapes",
    "decode_rle", "convert_context_annotations", "Resource", "DownloadError", "download", "extract",
    "fetch_resources",
]
