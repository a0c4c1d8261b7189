"""A training run: its parts, where it starts, its epochs and the rules that keep its work.

:class:`TrainingRun` holds what the epochs need (model, criterion, optimizer, scheduler, loaders, metric, where to
write); :func:`resume` restores a run from its checkpoint (:mod:`.state`, read once); :func:`train` runs the epochs
under the rules of a run:

* after every epoch the checkpoint is written atomically, and ``model_best.pth`` too when the epoch has the best
  ``(pixAcc + mIoU) / 2`` so far (checkpoint first, then the log row);
* a state holding NaN/inf is never saved: the last good checkpoint stays (:class:`RunFailed` names the tensor);
* Ctrl-C, SIGTERM or SIGHUP saves a resumable mid-epoch checkpoint (:class:`RunInterrupted`, exit status 128 +
  signal; under ``torchrun`` every rank stops at the same iteration and the main process saves);
* an evaluation that fails saves the trained epoch before the failure is reported.

The run takes its datasets, model, criterion and optimizer as arguments (:mod:`.config` builds them from options),
so a test passes a tiny dataset directly.
"""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from ..utils.checkpoint import CHECKPOINT_NAME, NonFiniteError, save_checkpoint
from ..utils.determinism import SeededSamples, set_rng_state
from ..utils.dist import get_rank, get_world_size, is_main_process
from ..utils.logger import EpochLogger
from ..utils.plot import write_curves
from ..utils.rundir import remove_stale_temp_files
from .loop import GracefulInterrupt, Interrupted, evaluate, train_one_epoch
from .sharding import full_state
from .previews import validation_previews
from .state import Checkpoint, ResumePoint, restore_best, training_state

__all__ = ["EXIT_INTERRUPTED", "RunFailed", "RunInterrupted", "TrainingRun", "base_dataset", "resume", "train"]

#: Exit status after an interrupt (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


class RunFailed(RuntimeError):
    """The run stopped with an error that the one-line report explains."""


class RunInterrupted(SystemExit):
    """Ctrl-C, SIGTERM or SIGHUP: a resumable checkpoint was written; exit status 128 + signal (130 for Ctrl-C)."""

    def __init__(self, message: str, status: int = EXIT_INTERRUPTED) -> None:
        super().__init__(status)
        self.message = message


def base_dataset(loader: DataLoader) -> Any:
    """The dataset of ``loader`` itself, under its ``Subset`` / seeding wrappers."""
    dataset = loader.dataset
    while isinstance(dataset, (Subset, SeededSamples)):
        dataset = dataset.dataset
    return dataset


@dataclass
class TrainingRun:
    """Everything the epochs need.

    Attributes:
        options: the run's options, saved with every checkpoint (``test.py`` / ``demo.py`` read the network's).
        epochs: train up to this epoch count.
        input_device: where the loops move each batch (``None``: a ``DataParallelModel`` scatters it).
        validate: evaluate after every epoch.
        count_skipped: log how many bad samples the datasets skipped.
        start: where the run starts (:func:`resume`).
        samplers: reordered each epoch (``set_epoch``).
        log_options: keywords of the :class:`~encoding.utils.logger.EpochLogger` (``tensorboard``, ``wandb``,
            ``config``).
        log_images: every this many epochs (and after the last), preview images of validation predictions go to
            TensorBoard / W&B (0: never).
    """

    model: nn.Module
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train_loader: DataLoader
    val_loader: DataLoader
    metric: Any
    class_names: List[str]
    output_dir: str
    options: Dict[str, Any]
    epochs: int
    input_device: Optional[torch.device] = None
    device_ids: List[torch.device] = field(default_factory=list)
    distributed: bool = False
    amp_dtype: Optional[torch.dtype] = None
    scaler: Optional[torch.amp.GradScaler] = None
    clip_grad: Optional[float] = None
    validate: bool = True
    count_skipped: bool = False
    start: ResumePoint = ResumePoint()
    samplers: List[Any] = field(default_factory=list)
    log_options: Dict[str, Any] = field(default_factory=dict)
    log_images: int = 0

    def set_epoch(self, epoch: int, start_iteration: int = 0) -> None:
        """Order the training samples for ``epoch``, skipping its first ``start_iteration`` batches."""
        for sampler in self.samplers:
            sampler.set_epoch(epoch, start=start_iteration * self.train_loader.batch_size)

    def datasets(self) -> List[Any]:
        """The training and validation datasets themselves (under ``Subset`` / seeding wrappers)."""
        return [base_dataset(self.train_loader), base_dataset(self.val_loader)]

    def describe(self) -> str:
        """A one-paragraph summary of the run for the log."""
        strategy = str(self.options.get("strategy", "ddp")).upper()
        where = (f"{strategy} rank {get_rank()}/{get_world_size()}" if self.distributed
                 else f"DataParallelModel on {[str(d) for d in self.device_ids] or ['cpu (direct)']}")
        o = self.options
        return (f"{o.get('model')}-{o.get('backbone')} on {o.get('dataset')}: {len(self.train_loader.dataset)} train "
                f"/ {len(self.val_loader.dataset)} val samples, batch {o.get('batch_size')}, {self.epochs} epochs, "
                f"lr {o.get('lr')}, {where}; writing to {self.output_dir}")

    def evaluate(self) -> Dict[str, Any]:
        """Score the model on the validation loader (``--eval``)."""
        return evaluate(self.model, self.val_loader, self.metric, self.input_device, self.amp_dtype)


def resume(checkpoint: Optional[Checkpoint], model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
           scaler: Optional[torch.amp.GradScaler], iters_per_epoch: int, *, weights_only: bool = False,
           start_epoch: int = 0) -> ResumePoint:
    """Restore a run from ``checkpoint`` (before the model is wrapped) and say where it continues.

    Args:
        checkpoint: the run's checkpoint (:func:`.state.read`), or ``None`` for a fresh run.
        weights_only: restore the weights only and start afresh (fine-tuning, evaluating).
        start_epoch: where a run without a training state starts.

    The model's RNG states continue where they stopped, and the learning-rate schedule is set to the resume point
    (iteration ``epoch * iters_per_epoch + iteration``): the rates are those an uninterrupted run would set.
    """
    point = ResumePoint(epoch=start_epoch)
    if checkpoint is not None and weights_only:
        checkpoint.restore_weights(model)
    elif checkpoint is not None:
        point = checkpoint.restore_training(model, optimizer, scaler)
        if point.rng is not None:  # the model's own randomness (dropout) continues where it stopped
            set_rng_state(point.rng)
    position = point.epoch * iters_per_epoch + point.iteration
    if scheduler is not None and position > 0:
        scheduler.last_epoch = position - 1  # torch's convention: the last iteration applied
        scheduler.step()
    return point


def _kept(run: TrainingRun) -> str:
    """What a diverged run leaves behind."""
    path = os.path.join(run.output_dir, CHECKPOINT_NAME)
    return f"the last good checkpoint {path} is kept" if os.path.isfile(path) else "no checkpoint was written"


def _save(run: TrainingRun, epoch: int, best: tuple, metrics: Mapping[str, Any], is_best: bool = False,
          iteration: int = 0, log_row: Optional[Mapping[str, Any]] = None) -> str:
    """Write the checkpoint (main process only; every rank calls it); a diverged state is refused, keeping the last
    good file."""
    path = os.path.join(run.output_dir, CHECKPOINT_NAME)
    model, optimizer = full_state(run.model, run.optimizer)  # every rank: fsdp / zero1 gather onto rank 0
    if not is_main_process():
        return path
    state = training_state(model, optimizer, run.scheduler, run.scaler, epoch=epoch, iteration=iteration,
                           best_pred=best[0], best_epoch=best[1], args=run.options, metrics=metrics,
                           log_row=log_row)
    try:
        return save_checkpoint(state, run.output_dir, is_best)
    except NonFiniteError as err:
        where = (f"epoch {epoch + 1} by iteration {iteration}" if iteration
                 else f"epoch {epoch} by iteration {len(run.train_loader)}, its last")
        raise RunFailed(f"training diverged in {where} (iterations counted from 1): {err.tensor} (try a lower --lr "
                        f"or --clip-grad); {_kept(run)}") from None


def _verify(run: TrainingRun) -> None:
    """Read every sample once, before training (``--verify-data``)."""
    for dataset in run.datasets():
        bad = dataset.verify()
        if bad and is_main_process():
            print(f"verify: dropped {bad} bad sample(s) of {dataset.split!r} (--skip-bad)")


def _by(interrupt: GracefulInterrupt) -> str:
    return "" if interrupt.signum in (None, signal.SIGINT) else f" by {signal.Signals(interrupt.signum).name}"


def _epoch(run: TrainingRun, epoch: int, best: tuple, interrupt: GracefulInterrupt) -> tuple:
    """Train and evaluate ``epoch``: ``(stats, evaluation result)``; an interrupt or a failure is saved first."""
    start = run.start.iteration if epoch == run.start.epoch else 0
    run.set_epoch(epoch, start)
    try:
        stats = train_one_epoch(run.model, run.criterion, run.optimizer, run.train_loader, run.scheduler, epoch,
                                run.input_device, run.scaler, run.amp_dtype, run.clip_grad, start_iteration=start,
                                stop=interrupt.poll)
    except Interrupted as stop:
        path = _save(run, epoch - 1, best, {}, iteration=stop.iteration)
        raise RunInterrupted(f"interrupted{_by(interrupt)} in epoch {epoch} after iteration {stop.iteration}; saved "
                             f"{path} (continue with --resume {path})", interrupt.exit_status) from None
    except FloatingPointError as err:  # a NaN/inf loss: nothing of this epoch is saved
        raise RunFailed(f"training diverged in epoch {epoch} ({err}); {_kept(run)}") from None
    result: Dict[str, Any] = {}
    try:
        if run.validate:
            result = evaluate(run.model, run.val_loader, run.metric, run.input_device, run.amp_dtype,
                              stop=None if run.distributed else interrupt.requested, epoch=epoch)
            stats.update({k: result[k] for k in ("pixAcc", "mIoU", "fgIoU") if k in result})  # fgIoU: binary
    except Interrupted:
        path = _save(run, epoch, best, {})
        raise RunInterrupted(f"interrupted{_by(interrupt)} while evaluating epoch {epoch}; its training is saved in "
                             f"{path} (continue with --resume {path})", interrupt.exit_status) from None
    except Exception as err:  # the trained epoch is saved before the failure is reported
        path = _save(run, epoch, best, {})
        raise RunFailed(f"evaluation after epoch {epoch} failed ({err}); the trained epoch is saved in "
                        f"{path}") from err
    return stats, result


def _log_epoch(run: TrainingRun, log: EpochLogger, epoch: int, row: Mapping[str, Any]) -> None:
    """The epoch's log row, and preview images when they are due (with a TensorBoard / W&B sink)."""
    log.write(epoch, **row)
    if log.sinks and run.log_images and (epoch % run.log_images == 0 or epoch + 1 == run.epochs):
        val = run.datasets()[1]
        log.images(epoch, validation_previews(run.model, val, run.options.get("palette") or run.options["dataset"]))


def train(run: TrainingRun, checkpoint: Optional[Checkpoint] = None, *, verify_data: bool = False) -> Dict[str, Any]:
    """Run the epochs from ``run.start`` to ``run.epochs``; returns the last evaluation result.

    Args:
        run: the run (its ``start`` set by :func:`resume`).
        checkpoint: the checkpoint the run resumed its training state from: the best model file and the log are
            completed from it (not read again).
        verify_data: read every sample once before training.

    Raises:
        RunFailed: the training diverged or an evaluation failed (the one-line report says what was kept).
        RunInterrupted: Ctrl-C, SIGTERM or SIGHUP; a resumable checkpoint was written.
    """
    if verify_data:
        _verify(run)
    result: Dict[str, Any] = {}
    best = (run.start.best_pred, run.start.best_epoch)
    with GracefulInterrupt() as interrupt, EpochLogger(run.output_dir, **run.log_options) as log:
        if is_main_process():
            remove_stale_temp_files(run.output_dir)
            if checkpoint is not None:
                restore_best(run.output_dir, checkpoint)
                log.resume_after(*checkpoint.log_resume())
        for epoch in range(run.start.epoch, run.epochs):
            stats, result = _epoch(run, epoch, best, interrupt)
            if run.count_skipped:
                stats["skipped"] = sum(d.num_skipped for d in run.datasets())
            score = (stats.get("pixAcc", 0.0) + stats.get("mIoU", 0.0)) / 2
            is_best = score > best[0]
            if is_best:
                best = (score, epoch)
            row = {**stats, **{f"IoU/{name}": float(iou) for name, iou in zip(run.class_names, result.get("IoU", ()))}}
            _save(run, epoch, best, result, is_best, log_row=row)
            _log_epoch(run, log, epoch, row)
            if is_main_process():
                print(f"epoch {epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in stats.items()))
            if epoch + 1 < run.epochs and interrupt.poll():  # under DDP, evaluation is not interrupted: stop here
                path = os.path.join(run.output_dir, CHECKPOINT_NAME)
                raise RunInterrupted(f"interrupted{_by(interrupt)} after epoch {epoch}; saved {path} (continue with "
                                     f"--resume {path})", interrupt.exit_status)
    if is_main_process() and log.csv_path:
        write_curves(log.csv_path)
    return result
