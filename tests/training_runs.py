"""Helpers shared by the tests of training runs: where a tiny run writes, a script's exit status, a tiny training
run of ``train.py`` and a small ``train.py``-style checkpoint."""
import os
import signal
from typing import List, Tuple

import torch
from conftest import TINY, load_script

from encoding.engine import Hook
from encoding.models import get_segmentation_model
from encoding.utils.checkpoint import CHECKPOINT_NAME, save_checkpoint

__all__ = ["load_train_script", "network_checkpoint", "run_dir_of", "run_script", "train_tiny", "SigintAt"]


def load_train_script():
    """``experiments/segmentation/train.py`` as a module."""
    return load_script("train")


def run_dir_of(out, model: str = "unet") -> str:
    """The run directory ``train.py --output-dir out`` writes on the ``shapes`` data with ``model``."""
    return os.path.join(str(out), "shapes", model, "default")


def run_script(script: str, argv: List[str], **kwargs) -> int:
    """The exit status of ``<script>.py`` (an argument error exits through ``SystemExit``)."""
    try:
        return load_script(script).cli(argv, **kwargs)
    except SystemExit as stop:
        return stop.code


def train_tiny(datasets, out, *extra: str, epochs: int = 1) -> Tuple[int, str]:
    """A tiny ``train.py`` run of ``epochs`` on ``datasets`` into ``out``: (exit status, its checkpoint's path)."""
    argv = TINY[:-2] + ["--epochs", str(epochs), "--output-dir", str(out), *extra]
    status = run_script("train", argv, datasets=datasets)
    return status, os.path.join(run_dir_of(out), CHECKPOINT_NAME)


def _network(name="psp", **extra):
    return dict(dataset="shapes", model=name, backbone="vgg_tiny", output_stride=16, crop_size=32, base_size=40,
                **extra)


def network_checkpoint(path, name: str = "psp", **extra) -> str:
    """A train.py-style checkpoint of a small ``name`` network (random weights) at ``path``."""
    options = _network(name, **extra)
    torch.manual_seed(0)
    model = get_segmentation_model(name, dataset="shapes", backbone="vgg_tiny", output_stride=16,
                                   **({"channels": extra["head_channels"]} if extra.get("head_channels") else {}))
    save_checkpoint({"model": model, "epoch": 0, "args": options}, str(path))
    return str(path)


class SigintAt(Hook):
    """Ctrl-C after iteration ``iteration`` of epoch ``epoch`` (the run saves a mid-epoch checkpoint and stops)."""

    def __init__(self, epoch: int, iteration: int) -> None:
        self.epoch, self.iteration = epoch, iteration

    def after_step(self, state) -> None:
        if (state.epoch, state.iteration) == (self.epoch, self.iteration):
            os.kill(os.getpid(), signal.SIGINT)
