"""Where a run's scalars and preview images go besides its CSV/JSONL logs: TensorBoard and Weights & Biases.

Each sink takes the same calls (:meth:`scalars`, :meth:`images`, :meth:`close`); :class:`~.logger.EpochLogger`
hands every epoch's row to each of its sinks. The libraries are optional and imported only when a sink is made:
``tensorboard`` (``pip install -e .[monitor]``), ``wandb`` (``pip install wandb``, run offline: nothing leaves the
machine; ``wandb sync`` uploads the run later).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, Mapping, Optional

import numpy as np

from ..errors import MissingDependency

__all__ = ["MonitorUnavailable", "INSTALL", "SINK_FILES", "require", "TensorBoardSink", "WandbSink", "scalars_of"]

#: What to install for each sink (the option ``--<name>`` of ``train.py`` asks for it).
INSTALL = {"tensorboard": "pip install -e .[monitor]", "wandb": "pip install wandb"}
#: What the sinks write into a run directory (glob patterns; ``train.py --overwrite`` removes them with the run).
SINK_FILES = ("events.out.tfevents.*", "wandb")


class MonitorUnavailable(MissingDependency):
    """The library of a requested sink is not installed (the message says what to install, exit status 2)."""


def require(name: str) -> None:
    """Check that the library of the sink ``name`` (``tensorboard`` or ``wandb``) is installed, without importing it.

    Raises:
        MonitorUnavailable: naming the option and what to install.
    """
    if importlib.util.find_spec(name) is None:
        raise MonitorUnavailable(f"--{name} needs the {name} package, which is not installed: {INSTALL[name]}")


def scalars_of(row: Mapping[str, Any]) -> Dict[str, float]:
    """The numbers of a log row, without its ``epoch`` (``None``, a NaN score, and non-numbers are left out)."""
    return {key: float(value) for key, value in row.items()
            if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool) and value == value}


class TensorBoardSink:
    """Scalars and images as TensorBoard event files in ``log_dir`` (``tensorboard --logdir runs``).

    Raises:
        MonitorUnavailable: ``tensorboard`` is not installed.
    """

    def __init__(self, log_dir: str) -> None:
        require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def images(self, step: int, images: Mapping[str, np.ndarray]) -> None:
        """``H x W x 3`` ``uint8`` images by tag."""
        for tag, image in images.items():
            self.writer.add_image(tag, image, global_step=step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Scalars and images as an offline Weights & Biases run under ``<log_dir>/wandb`` (step = epoch).

    Args:
        log_dir: the run directory.
        config: the run's options, recorded as the W&B run's config.
        name: the W&B run name.

    Raises:
        MonitorUnavailable: ``wandb`` is not installed.
    """

    def __init__(self, log_dir: str, config: Optional[Mapping[str, Any]] = None, name: Optional[str] = None) -> None:
        require("wandb")
        import wandb

        self._wandb = wandb
        self.run = wandb.init(mode="offline", dir=os.path.abspath(log_dir), project="encoding", name=name,
                              config=dict(config or {}), reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off"))

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def images(self, step: int, images: Mapping[str, np.ndarray]) -> None:
        self.run.log({tag: self._wandb.Image(image) for tag, image in images.items()}, step=step)

    def close(self) -> None:
        self.run.finish()
