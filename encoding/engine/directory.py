"""The run directory a training run writes to, and the run an earlier start left there: :func:`check_run_dir`
refuses to mix two runs in one directory, :func:`clear_earlier_run` is ``--overwrite``'s deletion."""
from __future__ import annotations

import glob
import os
import shutil
from typing import TYPE_CHECKING, List

from ..datasets.folder import HOLDOUT_NAME, LEGACY_HOLDOUT_NAME
from ..utils.checkpoint import BEST_NAME, CHECKPOINT_NAME
from ..utils.monitor import SINK_FILES
from ..utils.plot import CURVES_NAME
from . import state
from .data import ConfigError

if TYPE_CHECKING:
    from ..config import TrainingConfig

__all__ = ["RUN_CONFIG_NAME", "check_run_dir", "clear_earlier_run"]

#: The run directory's record of the run's options: ``train.py --config RUN/config.yaml`` repeats the run.
RUN_CONFIG_NAME = "config.yaml"


def _started(run_dir: str) -> List[str]:
    """The files of an earlier run in ``run_dir``."""
    names = (CHECKPOINT_NAME, BEST_NAME, "log.csv", "log.jsonl")
    return [name for name in names if os.path.exists(os.path.join(run_dir, name))]


def clear_earlier_run(run_dir: str) -> None:
    """``--overwrite``: the earlier run's files go (checkpoints, logs, curves, hold-out list, TensorBoard / W&B
    records), so nothing of it is mixed into the new run's."""
    for pattern in _started(run_dir) + [CURVES_NAME, HOLDOUT_NAME, LEGACY_HOLDOUT_NAME, *SINK_FILES]:
        for path in glob.glob(os.path.join(glob.escape(run_dir), pattern)):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)


def check_run_dir(config: "TrainingConfig") -> None:
    """Refuse to start a run in a directory that already holds another run (its checkpoints or logs), unless
    ``resume`` continues it (a checkpoint of that directory, without ``ft``), ``overwrite`` replaces it or ``eval``
    only evaluates. Asked by :func:`~.assemble.run_training` when the run starts, never while options are parsed
    (parsing reads no run directory).

    Raises:
        ConfigError: naming the directory, the files found and the three ways on.
    """
    c = config
    found = _started(c.run_dir) if not (c.eval or c.overwrite or _continues(c)) else []
    if found:
        path = state.resumable(c.run_dir)
        way = f": continue it with --resume {path}," if path else " and no checkpoint to continue it from:"
        raise ConfigError(f"{c.run_dir} already holds a run ({', '.join(found)}){way} replace it with --overwrite, "
                          "or pick another --checkname")
    own, path = os.path.join(c.run_dir, RUN_CONFIG_NAME), c.config_file
    if path and not c.eval and os.path.isfile(own) and os.path.samefile(path, own):  # the run writes its own again
        raise ConfigError(f"--config {path}: that is this run's own {RUN_CONFIG_NAME}, which the run writes "
                          "again (or --overwrite deletes): pass a copy of it, or another --checkname")


def _continues(config: "TrainingConfig") -> bool:
    """Whether the run continues its directory's run: ``--resume`` of a checkpoint there, without ``--ft``."""
    return bool(config.resume) and not config.ft and os.path.realpath(
        os.path.dirname(os.path.abspath(config.resume))) == os.path.realpath(config.run_dir)
