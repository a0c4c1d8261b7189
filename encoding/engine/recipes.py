"""Per-dataset recipes: configuration files named after their dataset, read through the script's own parser.

A dataset's recipe is ``<configs>/<dataset>.yaml`` (``experiments/segmentation/configs/`` for ``train.py``): the
values of :data:`RECIPE_KEYS` that a run on that dataset starts from (the training schedule, the network and the
image sizes of PyTorch-Encoding's ``train.py`` recipes). The file is the one place of those values:
``train.py --dataset ade20k`` fills its unset options from ``ade20k.yaml``, and ``train.py --config
configs/ade20k.yaml`` is the same run. The built-in run (``shapes``) needs no file: its values are
:class:`~.config.TrainingConfig`'s defaults, so the default run works without PyYAML. A dataset without a file
starts from those defaults too, with its own image sizes.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import fields
from typing import Any, Callable, Dict, Optional, Sequence

from ..utils.configfile import ConfigFileError, parse_config, read_config
from .config import ConfigError, TrainingConfig
from .data import BUILTIN_SIZES

__all__ = ["RECIPE_KEYS", "SIZE_KEYS", "recipe_path", "builtin_recipe", "read_recipe", "fill_from_recipe"]

#: The options a dataset's recipe sets (a recipe file holds these and ``dataset``, nothing else).
RECIPE_KEYS = ("model", "backbone", "output_stride", "head_channels", "base_size", "crop_size", "scale_range",
               "epochs", "batch_size", "lr", "optimizer", "weight_decay")
#: The image sizes: a dataset without a recipe file keeps its own (the loader's ``BASE_SIZE``, ...).
SIZE_KEYS = ("base_size", "crop_size", "scale_range")
#: What every recipe file states (the others may be left to the model or the dataset).
REQUIRED_KEYS = ("model", "backbone", "epochs", "batch_size", "lr", "optimizer", "weight_decay")


def recipe_path(directory: str, dataset: str) -> str:
    """Where the recipe of ``dataset`` lives in ``directory``."""
    return os.path.join(directory, f"{dataset}.yaml")


def builtin_recipe(dataset: str) -> Dict[str, Any]:
    """The recipe of a dataset without a file: :class:`~.config.TrainingConfig`'s defaults (the built-in ``shapes``
    run), with the dataset's own image sizes (``None``) when it is another dataset."""
    defaults = {**{f.name: f.default for f in fields(TrainingConfig)}, **BUILTIN_SIZES}
    own_sizes = dataset != defaults["dataset"]
    return {key: None if own_sizes and key in SIZE_KEYS else defaults[key] for key in RECIPE_KEYS}


def read_recipe(parser: argparse.ArgumentParser, directory: str, dataset: str) -> Dict[str, Any]:
    """The recipe of ``dataset``: its file in ``directory`` typed by ``parser`` (``train.py``'s), else
    :func:`builtin_recipe`.

    Raises:
        ConfigError: the file cannot be read (PyYAML missing included), sets another dataset or a key that is not
            a recipe's, or lacks one of the required keys; the message names the file.
    """
    path = recipe_path(directory, dataset)
    if not os.path.isfile(path):
        return builtin_recipe(dataset)
    try:
        keys = {str(k).replace("-", "_") for k in read_config(path)}
        values = vars(parse_config(parser, path))
    except ConfigFileError as err:
        raise ConfigError(f"{err} (the recipe of --dataset {dataset})") from None
    extra = sorted(keys - set(RECIPE_KEYS) - {"dataset"})
    missing = [k for k in REQUIRED_KEYS if values.get(k) is None]
    if values.get("dataset") != dataset or extra or missing:
        what = (f"sets dataset {values.get('dataset')!r}" if values.get("dataset") != dataset
                else f"sets {', '.join(extra)}, which a recipe does not" if extra else f"lacks {', '.join(missing)}")
        raise ConfigError(f"{path}: the recipe of --dataset {dataset} {what} (a recipe sets dataset and "
                          f"{', '.join(RECIPE_KEYS)})")
    return {key: values[key] for key in RECIPE_KEYS}


def fill_from_recipe(options: Any, names: Sequence[str], recipe: Callable[[str], Dict[str, Any]]) -> Optional[
        Dict[str, Any]]:
    """Set the attributes ``names`` of ``options`` that are ``None`` from ``recipe(options.dataset)``, read only when
    one is unset (the head width and the output stride only for the recipe's own model); returns the recipe, or ``None`` when unread.

    A recipe's learning rate is for its batch size: with the batch size given and the learning rate not, the rate
    scales linearly with the batch (PyTorch-Encoding's ``train.py`` rule, ``lr = recipe lr / 16 * batch``)."""
    if all(getattr(options, name) is not None for name in names):
        return None
    defaults = recipe(options.dataset)
    scale_lr = "lr" in names and options.lr is None and getattr(options, "batch_size", None) is not None
    for name in names:  # the output stride, like the head width, belongs to the recipe's own model
        if getattr(options, name) is None and (name != "output_stride" or options.model == defaults["model"]):
            setattr(options, name, defaults[name])
    if scale_lr and defaults["batch_size"]:
        options.lr = defaults["lr"] * options.batch_size / defaults["batch_size"]
    if options.head_channels is None and options.model == defaults["model"]:  # the width belongs to its head
        options.head_channels = defaults["head_channels"]
    return defaults
