"""Per-dataset recipes: configuration files named after their dataset, typed by the option fields.

A dataset's recipe is ``<directory>/<dataset>.yaml``: the values of :data:`RECIPE_KEYS` that a run on that dataset
starts from (the training schedule, the network and the image sizes of PyTorch-Encoding's ``train.py`` recipes).
The recipes of the known datasets, the built-in ``shapes`` run included, ship inside the package (package data,
:data:`RECIPE_DIR`), so :func:`encoding.config.resolve` and ``train.py`` read the same files: ``train.py --dataset
ade20k`` and ``resolve("train", ["--dataset", "ade20k"])`` fill their unset options from ``ade20k.yaml``, and
``train.py --config`` that file (:func:`recipe_file`) is the same run. A recipe is flat, one ``key: value`` per line
(values in JSON's spelling or a bare word, the format of a run's ``config.yaml``), so it is read without PyYAML
(:func:`read_flat`). A dataset without a file starts from the fields' defaults (:func:`builtin_recipe`), with its own
image sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import warnings
from typing import Any, Dict, Optional

from ..utils.configfile import ConfigFileError, config_argv
from .errors import ConfigError
from .fields import defaults, option_fields
from .groups import BUILTIN_SIZES, GROUPS
from .parser import build_parser

__all__ = ["RECIPE_DIR", "RECIPE_KEYS", "SIZE_KEYS", "REQUIRED_KEYS", "recipe_path", "recipe_file", "read_flat",
           "builtin_recipe", "read_recipe"]

#: The folder of the recipes shipped with the package (``<dataset>.yaml``, package data next to this module): what
#: :func:`~.resolve.resolve` reads unless it is given another folder.
RECIPE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipe_files")

#: The options a dataset's recipe sets (a recipe file holds these and ``dataset``, nothing else): the fields marked
#: ``recipe``.
RECIPE_KEYS = tuple(f.name for f, o in option_fields(*GROUPS.values()) if o.recipe)
#: The image sizes: a dataset without a recipe file keeps its own (the loader's ``BASE_SIZE``, ...).
SIZE_KEYS = ("base_size", "crop_size", "scale_range")
#: What every recipe file states (the others may be left to the model or the dataset).
REQUIRED_KEYS = ("model", "backbone", "epochs", "batch_size", "lr", "optimizer", "weight_decay")


def recipe_path(directory: str, dataset: str) -> str:
    """Where the recipe of ``dataset`` lives in ``directory``."""
    return os.path.join(directory, f"{dataset}.yaml")


def recipe_file(dataset: str) -> Optional[str]:
    """The path of the recipe of ``dataset`` shipped with the package (``None``: it has none, a user's dataset):
    the file to pass to ``train.py --config`` or to copy and edit."""
    path = recipe_path(RECIPE_DIR, dataset)
    return path if os.path.isfile(path) else None


def read_flat(path: str) -> Dict[str, Any]:
    """The mapping of the flat YAML file ``path``: ``key: value`` lines (``#`` comments), each value JSON (numbers,
    ``true``, ``null``, ``[0.5, 2.0]``, ``"text"``) or a bare word. Needs no PyYAML.

    Raises:
        ConfigFileError: a line that is not ``key: value``, or a key given twice (naming the file and the line).
    """
    data: Dict[str, Any] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
            if not text:
                continue
            key, sep, value = (part.strip() for part in text.partition(":"))
            if not sep or not key or key in data:
                what = "a key given twice" if key in data else "expected 'key: value'"
                raise ConfigFileError(f"{path}: line {number}: {what} (a recipe is flat), got {line.strip()!r}")
            try:
                data[key] = json.loads(value)
            except ValueError:
                data[key] = value or None
    return data


def builtin_recipe(dataset: str) -> Dict[str, Any]:
    """The recipe of a dataset without a file: the option fields' defaults (the built-in ``shapes`` run), with the
    dataset's own image sizes (``None``) when it is another dataset."""
    values = {**defaults(*GROUPS.values()), **BUILTIN_SIZES}
    own_sizes = dataset != values["dataset"]
    return {key: None if own_sizes and key in SIZE_KEYS else values[key] for key in RECIPE_KEYS}


def _typed(parser: argparse.ArgumentParser, path: str, data: Dict[str, Any]) -> Dict[str, Any]:
    """``data`` typed and checked by ``parser`` as the same options on the command line (one validation path)."""
    exit_on_error, parser.exit_on_error = parser.exit_on_error, False
    try:
        return vars(parser.parse_args(config_argv(parser, path, data)))
    except argparse.ArgumentError as err:
        raise ConfigFileError(f"{path}: {err}") from None
    finally:
        parser.exit_on_error = exit_on_error


def read_recipe(directory: Any, dataset: str, *old: str) -> Dict[str, Any]:
    """The recipe of ``dataset``: its file in ``directory`` (:func:`read_flat`, typed by the option fields), else
    :func:`builtin_recipe`. Every key of :data:`RECIPE_KEYS` is in the result (``None``: not set).

    ``read_recipe(parser, directory, dataset)``, the old call, still works (the parser is not needed: a
    ``FutureWarning``).

    Raises:
        ConfigError: ``directory`` is not a folder, or the file cannot be read, sets another dataset or a key that
            is not a recipe's, or lacks one of the required keys; the message names the folder or the file.
    """
    if isinstance(directory, argparse.ArgumentParser):
        warnings.warn("read_recipe(parser, directory, dataset) is now read_recipe(directory, dataset)", FutureWarning,
                      stacklevel=2)
        directory, dataset = dataset, old[0]
    if not os.path.isdir(directory):
        raise ConfigError(f"{directory}: no such folder of dataset recipes (the recipe of --dataset {dataset})")
    path = recipe_path(directory, dataset)
    if not os.path.isfile(path):
        return builtin_recipe(dataset)
    try:
        data = read_flat(path)
        values = _typed(build_parser("train"), path, data)
    except ConfigFileError as err:
        raise ConfigError(f"{err} (the recipe of --dataset {dataset})") from None
    keys = {str(k).replace("-", "_") for k in data}
    extra = sorted(keys - set(RECIPE_KEYS) - {"dataset"})
    missing = [k for k in REQUIRED_KEYS if values.get(k) is None]
    if values.get("dataset") != dataset or extra or missing:
        what = (f"sets dataset {values.get('dataset')!r}" if values.get("dataset") != dataset
                else f"sets {', '.join(extra)}, which a recipe does not" if extra else f"lacks {', '.join(missing)}")
        raise ConfigError(f"{path}: the recipe of --dataset {dataset} {what} (a recipe sets dataset and "
                          f"{', '.join(RECIPE_KEYS)})")
    return {key: values.get(key) for key in RECIPE_KEYS}


def recipe_source(directory: Optional[str], dataset: str) -> str:
    """How :func:`~.resolve.resolve`'s ``sources`` names the recipe of ``dataset``."""
    path = recipe_path(directory, dataset) if directory else None
    return f"recipe {path}" if path and os.path.isfile(path) else f"recipe (built-in, {dataset})"
