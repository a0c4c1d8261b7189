"""The run directory a training run writes to, and the run an earlier start left there: :func:`check_run_dir`
refuses to mix two runs in one directory, :func:`clear_earlier_run` is ``--overwrite``'s deletion (of the run that
:func:`replaces_earlier_run` says this one replaces) and :func:`made_dirs` removes the folders a failed run made."""
from __future__ import annotations

import contextlib
import glob
import os
import shutil
from typing import TYPE_CHECKING, Iterator, List

from ..datasets.folder import HOLDOUT_NAME, LEGACY_HOLDOUT_NAME
from ..errors import RunInterrupted
from ..utils.checkpoint import BEST_NAME, CHECKPOINT_NAME
from ..utils.monitor import SINK_FILES
from ..utils.curves import CURVES_NAME
from . import state
from .data import ConfigError

if TYPE_CHECKING:
    from ..config import TrainingConfig

__all__ = ["RUN_CONFIG_NAME", "check_run_dir", "clear_earlier_run", "earlier_run_files", "replaces_earlier_run",
           "made_dirs", "kept"]

#: The run directory's record of the run's options: ``train.py --config RUN/config.yaml`` repeats the run.
RUN_CONFIG_NAME = "config.yaml"


def kept(output_dir: str) -> str:
    """What a diverged run leaves behind."""
    path = os.path.join(output_dir, CHECKPOINT_NAME)
    return f"the last good checkpoint {path} is kept" if os.path.isfile(path) else "no checkpoint was written"


def _started(run_dir: str) -> List[str]:
    """The files of an earlier run in ``run_dir``."""
    names = (CHECKPOINT_NAME, BEST_NAME, "log.csv", "log.jsonl")
    return [name for name in names if os.path.exists(os.path.join(run_dir, name))]


def earlier_run_files(run_dir: str) -> List[str]:
    """What :func:`clear_earlier_run` deletes in ``run_dir``: the earlier run's checkpoints, logs, curves, hold-out
    list and TensorBoard / W&B records (files, and folders deleted whole)."""
    patterns = _started(run_dir) + [CURVES_NAME, HOLDOUT_NAME, LEGACY_HOLDOUT_NAME, *SINK_FILES]
    return [path for pattern in patterns for path in glob.glob(os.path.join(glob.escape(run_dir), pattern))]


def clear_earlier_run(run_dir: str) -> None:
    """``--overwrite``: the earlier run's files go (:func:`earlier_run_files`), so nothing of it is mixed into the new
    run's."""
    for path in earlier_run_files(run_dir):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def replaces_earlier_run(config: "TrainingConfig") -> bool:
    """Whether the run starts afresh over what its directory holds: ``--overwrite``, unless ``--eval`` (which writes
    nothing there). A resume of a checkpoint of another directory replaces it too: the directory's earlier run is
    not the one continued (a checkpoint of the directory itself is refused with ``--overwrite``:
    :func:`check_run_dir`)."""
    return bool(config.overwrite) and not config.eval and not _continues(config)


def _deletes(run_dir: str, path: str) -> bool:
    """Whether :func:`clear_earlier_run` in ``run_dir`` would delete the file ``path`` (or what a link there points
    to), itself or in a folder it deletes."""
    target = os.path.realpath(path)
    for doomed in map(os.path.realpath, earlier_run_files(run_dir)):
        if target == doomed or target.startswith(doomed.rstrip(os.sep) + os.sep):
            return True
    return False


def check_run_dir(config: "TrainingConfig") -> None:
    """Refuse to start a run in a directory that already holds another run (its checkpoints or logs), unless
    ``resume`` continues it (a checkpoint of that directory, without ``ft``), ``overwrite`` replaces it or ``eval``
    only evaluates; refuse ``overwrite`` with a ``resume`` that continues the directory's run or that the
    overwrite would delete (the run's own input). Asked by :func:`~.assemble.run_training` when the run starts, never
    while options are parsed (parsing reads no run directory).

    Raises:
        ConfigError: naming the directory, the files found and the three ways on; or ``--overwrite`` and the
            ``--resume`` file.
    """
    c = config
    found = _started(c.run_dir) if not (c.eval or c.overwrite or _continues(c)) else []
    if found:
        path = state.resumable(c.run_dir)
        way = f": continue it with --resume {path}," if path else " and no checkpoint to continue it from:"
        raise ConfigError(f"{c.run_dir} already holds a run ({', '.join(found)}){way} replace it with --overwrite, "
                          "or pick another --checkname")
    if c.overwrite and c.resume and not c.eval and (_continues(c) or _deletes(c.run_dir, c.resume)):
        flag = "--ft --resume" if c.ft else "--resume"
        why = "is one of the files it deletes" if _deletes(c.run_dir, c.resume) else "continues that run"
        way = "pick another --checkname" if c.ft else "drop --overwrite to continue it"
        raise ConfigError(f"--overwrite deletes the run in {c.run_dir}, and {flag} {c.resume} {why}: {way}, or "
                          f"copy the checkpoint out of {c.run_dir} and start from the copy")
    own, path = os.path.join(c.run_dir, RUN_CONFIG_NAME), c.config_file
    if path and not c.eval and os.path.isfile(own) and os.path.samefile(path, own):  # the run writes its own again
        raise ConfigError(f"--config {path}: that is this run's own {RUN_CONFIG_NAME}, which the run writes "
                          "again (or --overwrite deletes): pass a copy of it, or another --checkname")


def _continues(config: "TrainingConfig") -> bool:
    """Whether the run continues its directory's run: ``--resume`` of a checkpoint there, without ``--ft``."""
    return bool(config.resume) and not config.ft and os.path.realpath(
        os.path.dirname(os.path.abspath(config.resume))) == os.path.realpath(config.run_dir)


@contextlib.contextmanager
def made_dirs(directory: str) -> Iterator[None]:
    """Remove the folders up to ``directory`` that this run creates, if it fails before writing anything there."""
    missing, path = [], os.path.abspath(directory)
    while not os.path.exists(path):
        missing.append(path)
        path = os.path.dirname(path)
    try:
        yield
    except BaseException as err:
        if not isinstance(err, RunInterrupted):  # an interrupt that saved: kept
            for folder in missing:  # deepest first; a folder with anything in it stays
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
        raise
