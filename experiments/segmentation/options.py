"""Command-line options of the segmentation scripts (PyTorch-Encoding names), with per-dataset recipes.

The options are the fields of :mod:`encoding.config.groups` (one field per option: help, type, choices, default);
:func:`encoding.config.resolve` fills what is not given, in one documented order (defaults < the dataset's recipe,
shipped with the package (:data:`encoding.config.RECIPE_DIR`) < the checkpoint's network (test/demo) < ``--config
FILE`` < the command line, then its rules), and :func:`encoding.engine.assemble.check_settings` refuses what cannot
run. Bad input: one line, exit status 2. ``configs/`` holds the other experiments (``train.py --config FILE``).
"""
import argparse
import os
from typing import List, Optional

from encoding.config import ConfigError, Settings, build_parser, resolve
from encoding.config.training import TrainingConfig
from encoding.config.evaluation import NETWORK_OPTIONS
from encoding.engine.assemble import check_settings
from encoding.inference.evaluation import weights_options

__all__ = ["CONFIGS", "MODEL_OPTIONS", "build_parser", "settings", "parse_args", "training_config"]

#: The experiment configurations of ``train.py --config`` other than the dataset recipes (those ship with the package:
#: :data:`encoding.config.RECIPE_DIR`, read by :func:`encoding.config.resolve` as by these scripts).
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
#: Options that define the network; ``test.py`` / ``demo.py`` take them from the checkpoint when not given.
MODEL_OPTIONS = NETWORK_OPTIONS


def settings(argv: Optional[List[str]] = None, script: str = "train") -> Settings:
    """The resolved and checked settings of ``script`` run with ``argv`` (exit status 2 with one line if bad)."""
    try:
        resolved = resolve(script, argv, read_saved=None if script == "train" else weights_options)
        check_settings(resolved)
    except (ConfigError, ValueError, OSError) as err:  # ValueError/OSError: an unreadable --resume (test/demo)
        build_parser(script).error(str(err).splitlines()[0])
    return resolved


def parse_args(argv: Optional[List[str]] = None, script: str = "train") -> argparse.Namespace:
    """The options of ``script`` (:func:`settings`) as a namespace: ``TrainingConfig(**vars(...))`` for train."""
    return settings(argv, script).namespace()


def training_config(argv: Optional[List[str]] = None) -> TrainingConfig:
    """``train.py``'s :class:`~encoding.config.TrainingConfig`, with where each value came from."""
    return settings(argv, "train").training()
