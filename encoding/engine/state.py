"""What a training run saves and how it resumes: the run's checkpoint schema, written and read only here.

A run's checkpoint (written atomically by :func:`encoding.utils.save_checkpoint`, which also refuses NaN/inf) holds

* ``model``, ``optimizer``, ``scheduler``, ``scaler``: state dicts (full and ordinary under every strategy:
  :mod:`.sharding`);
* ``epoch``: the last complete epoch; ``iteration``: training iterations of the *next* epoch already done (a
  checkpoint saved on Ctrl-C), else 0; ``world_size``: the processes of the run (a mid-epoch checkpoint continues
  only with as many: :meth:`Checkpoint.world_size_problem`);
* ``best_pred`` / ``best_epoch``: the best score so far, ``(pixAcc + mIoU) / 2``, and the epoch that scored it;
* ``args``: the run's options (a plain dict: ``test.py`` / ``demo.py`` rebuild the network from it);
* ``rng``: the global RNG states (dropout continues where it stopped); under ``torchrun`` also ``rng_ranks``,
  every rank's (:func:`gathered_rng_states`: each rank continues its own);
* ``log_row``: the epoch's log row (the log is completed from it when the run stopped between the checkpoint and
  the log); ``metrics``: pixAcc and mIoU;
* ``unevaluated``: present when ``epoch`` trained but its evaluation did not end (a signal or a failure during it):
  the epoch's training numbers (``loss``, ``lr``...); the resume evaluates, ranks and logs that epoch first;
* ``hooks``: the states of the user's hooks that have ``state_dict()`` (:func:`hook_states`);
* ``epoch_totals``: with ``iteration``, the ``[total, count]`` of the loss and the rate over the iterations done,
  summed over ranks (the resumed epoch's averages cover the whole epoch).

Resuming reads the file once (:func:`read`); everything a resumed run needs comes from that one
:class:`Checkpoint`: whether it is finished (:meth:`Checkpoint.finished`), the training state
(:meth:`Checkpoint.restore_training`), the best model file (:func:`restore_best`) and the log
(:meth:`Checkpoint.log_resume`). A resume of a finished run trains nothing but completes its directory
(:func:`complete_finished`).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Union

import torch
from torch import nn

from ..utils.checkpoint import BEST_NAME, CHECKPOINT_NAME, CheckpointError, _plain, load_checkpoint, load_model_state
from ..utils.determinism import rng_state
from ..utils.dist import get_rank, get_world_size, is_dist_avail_and_initialized
from ..utils.files import atomic_write
from ..utils.logger import EpochLogger
from ..utils.curves import CURVES_NAME, write_curves
from ..utils.rundir import RunDirLock, RunDirLocked, remove_stale_temp_files
from .sharding import load_optimizer_state

__all__ = ["Checkpoint", "ResumePoint", "ResumeRefused", "read", "training_state", "restore_best", "resumable",
           "complete_finished", "saved_options", "gathered_rng_states", "hook_states",
           "load_hook_states"]

PathLike = Union[str, os.PathLike]


class ResumePoint(NamedTuple):
    """Where a run continues.

    Attributes:
        epoch: the next epoch to run.
        iteration: training iterations of ``epoch`` already done (a checkpoint saved on interrupt), else 0.
        best_pred: the best score so far.
        best_epoch: the epoch that scored it (-1: none yet).
        rng: the global RNG states to restore (:func:`~encoding.utils.determinism.set_rng_state`), or ``None``.
        unevaluated: the training numbers of epoch ``epoch - 1``, trained but not evaluated (evaluate it first), or
            ``None``.
        totals: the running ``{name: [total, count]}`` of ``epoch``'s first ``iteration`` iterations (loss, lr),
            summed over ranks, or ``None``.
    """

    epoch: int = 0
    iteration: int = 0
    best_pred: float = 0.0
    best_epoch: int = -1
    rng: Optional[dict] = None
    unevaluated: Optional[dict] = None
    totals: Optional[dict] = None


class ResumeRefused(CheckpointError):
    """A checkpoint this run cannot continue as asked (one line; scripts exit with status 2, before any work)."""

    exit_status = 2


class Checkpoint(NamedTuple):
    """A run's checkpoint file, read once (:func:`read`): its path and its content."""

    path: str
    data: Dict[str, Any]

    @property
    def done(self) -> int:
        """Complete epochs recorded (trained; the last one maybe not evaluated yet: :attr:`unevaluated`)."""
        return int(self.data.get("epoch", -1)) + 1

    @property
    def unevaluated(self) -> Optional[dict]:
        """The training numbers of the last epoch when its evaluation did not end (the resume evaluates it), else
        ``None``."""
        pending = self.data.get("unevaluated")
        return None if pending is None else dict(pending)

    def finished(self, epochs: int) -> bool:
        """Whether the checkpoint already completed ``epochs`` epochs (nothing left to train or evaluate)."""
        if self.unevaluated is not None:
            return self.done - 1 >= epochs
        return self.done >= epochs and not self.data.get("iteration", 0)

    def rng_of(self, rank: int) -> Optional[dict]:
        """The RNG states of ``rank``: its own (``rng_ranks``, a ``torchrun`` run's), else the main process's."""
        ranks = self.data.get("rng_ranks") or []
        return ranks[rank] if rank < len(ranks) else self.data.get("rng")

    def check_world_size(self, world_size: int) -> None:
        """Raise :class:`ResumeRefused` with :meth:`world_size_problem`'s reason, if any."""
        if problem := self.world_size_problem(world_size):
            raise ResumeRefused(problem)

    def world_size_problem(self, world_size: int) -> Optional[str]:
        """Why a run of ``world_size`` processes cannot continue this checkpoint (``None``: it can).

        A checkpoint saved in the middle of an epoch stopped after ``iteration`` batches of each of its ranks'
        shards; another world size shards the epoch otherwise, so samples would be trained twice or skipped.
        At an epoch boundary any world size continues exactly. (Files written before the world size was recorded
        are not checked.)"""
        saved, iteration = self.data.get("world_size"), int(self.data.get("iteration", 0) or 0)
        if not iteration or saved is None or int(saved) == world_size:
            return None
        return (f"{self.path} stopped after iteration {iteration} of epoch {self.done} with {saved} process(es), "
                f"this run has {world_size}: the epoch's remaining samples are sharded over {saved}; resume it "
                f"with {saved} process(es) (torchrun --nproc-per-node {saved}), or continue from an epoch's end")

    def restore_weights(self, model: nn.Module) -> None:
        """Load the model weights only (fine-tuning, evaluating).

        Raises:
            CheckpointError: the weights do not match ``model``.
        """
        load_model_state(model, self.data["model"], source=repr(self.path))

    def restore_training(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                         scaler: Optional[torch.amp.GradScaler] = None) -> ResumePoint:
        """Restore the model, the optimizer (and the scaler when the file has its state); say where to continue.

        The optimizer's state (moments, step counts) comes from the file; its hyperparameters (weight decay,
        momentum, betas, ...) stay those ``optimizer`` was built with, i.e. this run's options, which its checkpoints
        record. The learning-rate schedule is not read back: the run sets it from the resume point (epoch,
        iteration).

        Raises:
            CheckpointError: the weights do not match ``model``, or the file has no optimizer state.
        """
        self.restore_weights(model)
        if self.data.get("optimizer") is None:
            raise CheckpointError(f"{self.path!r} has no 'optimizer' state to restore")
        chosen = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
        load_optimizer_state(model, optimizer, self.data["optimizer"])  # sharded by fsdp / zero1 where they run
        for group, options in zip(optimizer.param_groups, chosen):  # this run's options (weight decay, momentum)
            group.update(options)
        if scaler is not None and self.data.get("scaler"):  # a bf16/fp32 run saved no scaler state
            scaler.load_state_dict(self.data["scaler"])
        return ResumePoint(epoch=self.done, iteration=int(self.data.get("iteration", 0)),
                           best_pred=float(self.data.get("best_pred", 0.0)),
                           best_epoch=int(self.data.get("best_epoch", -1)), rng=self.rng_of(get_rank()),
                           unevaluated=self.unevaluated, totals=self.data.get("epoch_totals"))

    def log_resume(self) -> tuple:
        """``(last logged epoch, its log row)``: arguments of :meth:`encoding.utils.EpochLogger.resume_after` (an
        epoch not evaluated yet has no row: the resume writes it)."""
        if self.unevaluated is not None:
            return self.data.get("epoch", -1) - 1, None
        return self.data.get("epoch", -1), self.data.get("log_row")


def read(path: PathLike, allow_foreign: bool = False) -> Checkpoint:
    """Read a checkpoint file (on the CPU, ``weights_only``): the one read of a resumed run.

    Args:
        allow_foreign: also accept a plain state dict or a PyTorch-Encoding checkpoint (weights only).

    Raises:
        FileNotFoundError, CheckpointError: see :func:`~encoding.utils.load_checkpoint`; also a count of the
            training state (``epoch``, ``iteration``, ``world_size``, ``best_epoch``) or ``args`` of the wrong type
            (an edited file), in one line.
    """
    data = load_checkpoint(path, map_location="cpu", allow_foreign=allow_foreign)
    _check_counts(data, os.fspath(path))
    return Checkpoint(os.fspath(path), data)


#: The counts of the training state -> their smallest valid value.
_COUNTS = {"epoch": -1, "iteration": 0, "world_size": 1, "best_epoch": -1}


def _check_counts(data: Mapping[str, Any], path: str) -> None:
    for key, smallest in _COUNTS.items():
        value = data.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < smallest):
            raise CheckpointError(f"{path!r}: {key} must be an int >= {smallest}, got {str(repr(value))[:60]} "
                                  "(an edited or foreign file)")
    for key, kind in (("args", Mapping), ("unevaluated", Mapping), ("hooks", Mapping), ("rng_ranks", list),
                      ("epoch_totals", Mapping)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise CheckpointError(f"{path!r}: {key} must be a {kind.__name__}, got {type(data[key]).__name__} (an "
                                  "edited or foreign file)")


def training_state(model: Union[nn.Module, Mapping[str, Any]], optimizer: Union[torch.optim.Optimizer, Mapping],
                   scheduler: Any, scaler: Optional[torch.amp.GradScaler], *, epoch: int, iteration: int,
                   best_pred: float, best_epoch: int, args: Mapping[str, Any], metrics: Mapping[str, Any],
                   log_row: Optional[Mapping[str, Any]] = None, unevaluated: Optional[Mapping[str, Any]] = None,
                   rng_ranks: Optional[Sequence[dict]] = None, hooks: Optional[Mapping[str, Any]] = None,
                   totals: Optional[Mapping[str, Sequence[float]]] = None) -> Dict[str, Any]:
    """The checkpoint of a run after ``epoch`` (with ``iteration > 0``: that many iterations of the next epoch are
    done too), RNG states included; written by :func:`encoding.utils.save_checkpoint`. ``model`` and ``optimizer``
    are the objects or their full state dicts (a sharded run's, :func:`.sharding.full_state`). ``unevaluated``: the
    epoch's training numbers when its evaluation did not end; ``rng_ranks``: every rank's RNG states
    (:func:`gathered_rng_states`); ``hooks``: :func:`hook_states`; ``totals``: the running epoch's loss / lr totals
    (``iteration > 0``; :meth:`~encoding.utils.MetricLogger.totals`)."""
    saved = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler, "epoch": epoch,
             "iteration": iteration, "world_size": get_world_size(), "best_pred": best_pred,
             "best_epoch": best_epoch, "args": dict(args),
             "rng": rng_state(), "log_row": dict(log_row or {}),
             "metrics": {k: metrics[k] for k in ("pixAcc", "mIoU") if k in metrics}}
    extra = {"unevaluated": None if unevaluated is None else dict(unevaluated), "rng_ranks": rng_ranks,
             "hooks": hooks or None, "epoch_totals": None if totals is None else dict(totals)}
    return {**saved, **{k: v for k, v in extra.items() if v is not None}}


def gathered_rng_states() -> Optional[List[dict]]:
    """Every rank's RNG states (:func:`~encoding.utils.determinism.rng_state`), by rank, on the main process
    (``None`` on the others, and when not distributed): a collective under ``torch.distributed``, every rank calls
    it. Each rank draws its own dropout masks (seeded ``seed + rank``), so each resumes its own state."""
    if not is_dist_avail_and_initialized():
        return None
    import torch.distributed as dist

    states: Optional[List[Any]] = [None] * get_world_size() if get_rank() == 0 else None
    dist.gather_object(rng_state(), states, dst=0)
    return states


def _hook_key(index: int, hook: Any) -> str:
    return f"{index}:{type(hook).__qualname__}"


def hook_states(hooks: Sequence[Any]) -> Dict[str, Any]:
    """The states of ``hooks`` (the user's, in order) that have ``state_dict()``, keyed ``"<index>:<class>"``; each
    must hold only what a ``weights_only`` load reads (tensors, numbers, strings, plain containers).

    Raises:
        TypeError: naming the hook and the value it cannot store.
    """
    states = {}
    for index, hook in enumerate(hooks):
        if callable(getattr(hook, "state_dict", None)):
            try:
                states[_hook_key(index, hook)] = _plain(hook.state_dict())
            except TypeError as err:
                raise TypeError(f"hook {type(hook).__qualname__}: its state_dict() {err}") from None
    return states


def load_hook_states(hooks: Sequence[Any], saved: Optional[Mapping[str, Any]]) -> None:
    """Give each of ``hooks`` that has ``load_state_dict()`` the state :func:`hook_states` saved for it (same position
    and class); a hook without a saved state starts afresh."""
    for index, hook in enumerate(hooks):
        key = _hook_key(index, hook)
        if saved and key in saved and callable(getattr(hook, "load_state_dict", None)):
            hook.load_state_dict(saved[key])


def restore_best(directory: PathLike, checkpoint: Optional[Checkpoint] = None) -> Optional[str]:
    """Rewrite ``model_best.pth`` from ``checkpoint.pth`` when the checkpoint records that it is the best one
    (``best_epoch == epoch``) but the best file is missing or holds another epoch (a run stopped between the two
    writes). Returns the path written, or ``None`` when nothing had to be done.

    Args:
        directory: the run directory.
        checkpoint: the directory's ``checkpoint.pth`` when it was read already (it is not read again).
    """
    directory = os.fspath(directory)
    path, best = os.path.join(directory, CHECKPOINT_NAME), os.path.join(directory, BEST_NAME)
    if not os.path.isfile(path):
        return None
    if checkpoint is None or os.path.abspath(checkpoint.path) != os.path.abspath(path):
        checkpoint = read(path)
    epoch = checkpoint.data.get("epoch")
    if epoch is None or checkpoint.data.get("best_epoch") != epoch or checkpoint.data.get("iteration", 0):
        return None
    if os.path.isfile(best) and load_checkpoint(best, map_location="cpu").get("epoch") == epoch:
        return None
    with open(path, "rb") as f:
        atomic_write(best, f.read())
    return best


def complete_finished(directory: PathLike, checkpoint: Checkpoint) -> bool:
    """Complete the run directory of a finished run whose last process died after its last checkpoint (``kill -9``
    before the end of the run): ``model_best.pth`` (:func:`restore_best`), the log's last row
    (:meth:`Checkpoint.log_resume`) and ``curves.png`` are restored, and the dead run's lock file and the
    temporary files of its interrupted writes go. Returns whether it was done.

    Nothing is done when ``checkpoint`` is not the directory's own ``checkpoint.pth``, or while a live run holds the
    directory (or it cannot be written).
    """
    directory = os.fspath(directory)
    path = os.path.join(directory, CHECKPOINT_NAME)
    if not os.path.isfile(path) or not os.path.samefile(checkpoint.path, path):
        return False
    try:
        with RunDirLock(directory):
            remove_stale_temp_files(directory)
            restore_best(directory, checkpoint)
            log = EpochLogger(directory, enabled=True)
            log.resume_after(*checkpoint.log_resume())
            if not os.path.isfile(os.path.join(directory, CURVES_NAME)) and os.path.isfile(log.csv_path):
                write_curves(log.csv_path)
    except RunDirLocked:  # held by a live run, or not writable
        return False
    return True


def resumable(directory: PathLike) -> Optional[str]:
    """The file a resume of the run in ``directory`` continues from: its ``checkpoint.pth``, else its
    ``model_best.pth``, else ``None``. The best file is written first, from the same bytes
    (:func:`~encoding.utils.save_checkpoint`), so a run stopped between the two writes of its first epoch holds only
    that one: a complete checkpoint of the epoch."""
    for name in (CHECKPOINT_NAME, BEST_NAME):
        path = os.path.join(os.fspath(directory), name)
        if os.path.isfile(path):
            return path
    return None


def saved_options(path: PathLike, names: Sequence[str]) -> Dict[str, Any]:
    """The options ``names`` a run recorded in its checkpoint (``None`` for those it did not record)."""
    saved = load_checkpoint(path, map_location="cpu").get("args") or {}
    return {name: saved.get(name) for name in names}
