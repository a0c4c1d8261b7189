"""Per-dataset recipes: their home is :mod:`encoding.config.recipes`; the engine keeps these names.

:func:`encoding.config.resolve` applies a recipe to a script's options, once, with its rules (the linear learning-rate
scaling, the model-specific values) and the source of each value.
"""
from __future__ import annotations

from ..config.recipes import REQUIRED_KEYS, RECIPE_KEYS, SIZE_KEYS, builtin_recipe, read_recipe, recipe_path

__all__ = ["RECIPE_KEYS", "SIZE_KEYS", "REQUIRED_KEYS", "recipe_path", "builtin_recipe", "read_recipe"]
