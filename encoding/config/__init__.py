"""A run's settings in one place: the option fields, the parsers made from them, the recipes and :func:`resolve`.

* :mod:`.fields` / :mod:`.groups`: one dataclass field per option (help, type, choices, default in its metadata),
  grouped as the network, the data, the optimisation, the devices and the run (plus what ``test.py`` / ``demo.py``
  add);
* :mod:`.parser`: the argparse parsers of ``train.py`` / ``test.py`` / ``demo.py``, generated from the fields;
* :mod:`.recipes`: the per-dataset recipe files, shipped with the package (:data:`RECIPE_DIR`);
* :mod:`.resolve`: :func:`resolve`, the one order (defaults < recipe < checkpoint's network < config file < command
  line; then the documented rules) returning frozen :class:`Settings` that record where each value came from;
* :mod:`.training`: ``TrainingConfig``, the flat view of ``train.py``'s settings that the engine runs (importable
  from here; documented with the engine, :class:`encoding.engine.TrainingConfig`).

A leaf: nothing here imports :mod:`encoding.engine` (the engine imports this).
"""
from .errors import ConfigError
from .fields import SCRIPTS, Option, option
from .groups import (AMP_CHOICES, AMP_DTYPES, AUX_WEIGHT_LIBRARY, BUILTIN_SIZES, DIST_TIMEOUT_S, GROUPS, OPTIMIZERS, RECOMPUTE_POLICIES,
                     STRATEGIES,
                     DataOptions, DemoOptions, DeviceOptions, EvalOptions, ModelOptions, OptimOptions, RunOptions,
                     WeightOptions)
from .parser import build_parser, option_specs
from .recipes import RECIPE_DIR, RECIPE_KEYS, builtin_recipe, read_recipe, recipe_file
from .evaluation import NETWORK_OPTIONS
from .resolve import ORDER, RULES, Settings, resolve
from .training import TrainingConfig  # noqa: F401 (documented with encoding.engine)

__all__ = ["ConfigError", "BUILTIN_SIZES", "SCRIPTS", "Option", "option", "AMP_CHOICES", "AMP_DTYPES", "AUX_WEIGHT_LIBRARY", "DIST_TIMEOUT_S",
           "GROUPS", "OPTIMIZERS", "RECOMPUTE_POLICIES", "STRATEGIES", "DataOptions", "DemoOptions", "DeviceOptions",
           "EvalOptions", "ModelOptions", "OptimOptions", "RunOptions", "WeightOptions", "build_parser",
           "option_specs", "RECIPE_DIR", "RECIPE_KEYS", "builtin_recipe", "read_recipe", "recipe_file",
           "NETWORK_OPTIONS", "ORDER", "RULES", "Settings", "resolve"]
