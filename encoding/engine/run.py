"""A training run: its parts, where it starts, and its epochs calling the hooks that keep its work.

:class:`TrainingRun` holds what the epochs need (model, criterion, optimizer, scheduler, loaders, metric, where to
write); :func:`resume` restores a run from its checkpoint (:mod:`.state`, read once); :func:`train` runs the epochs
and calls the hooks (:mod:`.hooks`): the rules of a run are built-in hooks, and a caller adds its own:

* after every epoch the checkpoint is written atomically, and ``model_best.pth`` too when the epoch has the best
  ``(pixAcc + mIoU) / 2`` so far (checkpoint first, then the log row: :class:`~.hooks.Checkpointer`);
* a NaN/inf loss stops the run before its step, and a state holding NaN/inf is never saved: the last good
  checkpoint stays (:class:`RunFailed` names the iteration or the tensor; :class:`~.hooks.DivergenceCheck`);
* Ctrl-C, SIGTERM or SIGHUP saves a resumable mid-epoch checkpoint (:class:`~.hooks.StopOnSignal`,
  :class:`RunInterrupted`, exit status 128 + signal; under ``torchrun`` every rank stops at the same iteration and
  the main process saves);
* an evaluation that fails (or is interrupted) saves the trained epoch before the failure is reported
  (:class:`~.hooks.Evaluation`), marked unevaluated: the resumed run evaluates, ranks and logs it first.

:func:`train` itself only orders the events: it keeps no rule of its own.

The run takes its datasets, model, criterion and optimizer as arguments (:mod:`.config` builds them from options),
so a test passes a tiny dataset directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset

from ..errors import EXIT_INTERRUPTED, RunInterrupted
from ..names import network_name
from ..utils.determinism import SeededSamples, set_rng_state
from ..utils.dist import get_rank, get_world_size, is_main_process
from .hooks import Hook, RunFailed, RunState, default_hooks
from .loop import epoch_meters, evaluate, train_one_epoch
from .state import Checkpoint, ResumePoint

__all__ = ["EXIT_INTERRUPTED", "Hook", "RunFailed", "RunInterrupted", "RunState", "TrainingRun", "base_dataset",
           "resume", "train"]


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
        return (f"{network_name(o.get('model'), o.get('backbone'))} on {o.get('dataset')}: "
                f"{len(self.train_loader.dataset)} train / {len(self.val_loader.dataset)} val samples, batch "
                f"{o.get('batch_size')}, {self.epochs} epochs, lr {o.get('lr')}, {where}; writing to {self.output_dir}")

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

    The model's RNG states continue where they stopped (each rank's its own, when the checkpoint holds them), and
    the learning-rate schedule is set to the resume point (iteration ``epoch * iters_per_epoch + iteration``): the
    rates are those an uninterrupted run would set.
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


def _train_epoch(run: TrainingRun, state: RunState, hooks: Sequence[Hook]) -> None:
    """Train ``state.epoch`` (from its saved iteration when it resumes), calling ``after_step`` after every step."""
    start = run.start.iteration if state.epoch == run.start.epoch else 0
    state.iteration = start
    run.set_epoch(state.epoch, start)
    # the iterations done before a mid-epoch resume count in the epoch's averages (summed over ranks: added once)
    state.meters = epoch_meters(run.start.totals if start and is_main_process() else None)

    def before_step(iteration: int, loss: float) -> None:
        state.iteration, state.step = iteration, {"loss": loss}
        _call(hooks, "before_step", state)

    def after_step(iteration: int, step: Dict[str, float]) -> None:
        state.iteration, state.step = iteration, step
        _call(hooks, "after_step", state)

    state.stats = train_one_epoch(run.model, run.criterion, run.optimizer, run.train_loader, scheduler=run.scheduler,
                                  epoch=state.epoch, device=run.input_device, scaler=run.scaler,
                                  amp_dtype=run.amp_dtype, clip_grad_norm=run.clip_grad, start_iteration=start,
                                  before_step=before_step, on_step=after_step, meters=state.meters)


def _call(hooks: Sequence[Hook], event: str, state: RunState) -> None:
    """Call ``event`` on every hook, in order."""
    for hook in hooks:
        getattr(hook, event)(state)


def train(run: TrainingRun, checkpoint: Optional[Checkpoint] = None, *, verify_data: bool = False,
          hooks: Sequence[Hook] = ()) -> Dict[str, Any]:
    """Run the epochs from ``run.start`` to ``run.epochs``, calling the hooks; returns the last evaluation result.

    The rules of the run are hooks (:func:`.hooks.default_hooks`: evaluation, checkpoint and best model, logs,
    previews, curves, the stop on a signal); ``hooks`` adds the caller's own, called after the evaluation and before
    the checkpoint (what they add to ``state.stats`` is saved and logged). Each hook gets ``before_train``, then per
    epoch ``before_epoch``, ``before_step`` after every forward, ``after_step`` after every step and
    ``after_epoch``, and ``after_train`` (also when the run stops with an error).

    An epoch the checkpoint trained but did not evaluate (``run.start.unevaluated``: stopped during its evaluation)
    gets its ``after_epoch`` first, with its saved training numbers: it is evaluated, ranked, saved and logged as the
    uninterrupted run would have.

    Args:
        run: the run (its ``start`` set by :func:`resume`).
        checkpoint: the checkpoint the run resumed its training state from: the best model file and the log are
            completed from it (not read again).
        verify_data: read every sample once before training (``VerifyData``); a sample dropped then (``skip_bad``)
            is refused: the loaders counted it. A configuration's ``verify_data`` reads them as the run is built.
        hooks: the caller's :class:`~.hooks.Hook` objects.

    Raises:
        RunFailed: the training diverged or an evaluation failed (the one-line report says what was kept).
        RunInterrupted: Ctrl-C, SIGTERM or SIGHUP; a resumable checkpoint was written.
    """
    hooks = default_hooks(run, verify_data=verify_data, user=hooks)
    state = RunState(run=run, checkpoint=checkpoint, epoch=run.start.epoch,
                     best=(run.start.best_pred, run.start.best_epoch))
    try:
        _call(hooks, "before_train", state)
        if run.start.unevaluated is not None:  # trained, stopped while evaluating: evaluated (and logged) first
            state.epoch, state.stats = run.start.epoch - 1, dict(run.start.unevaluated)
            state.iteration = len(run.train_loader)
            _call(hooks, "after_epoch", state)
        for epoch in range(run.start.epoch, run.epochs):
            state.epoch, state.stats, state.is_best = epoch, {}, False
            _call(hooks, "before_epoch", state)
            _train_epoch(run, state, hooks)
            _call(hooks, "after_epoch", state)
    except BaseException as err:
        state.error = err
        raise
    finally:
        _call(hooks, "after_train", state)
    return state.result
