"""The rules of a training run as hooks: :class:`Hook` and the built-in ones.

:func:`~.run.train` calls, on each hook in order, ``before_train`` once, then for every epoch ``before_epoch``,
``before_step`` after every forward (a hook may refuse the step by raising), ``after_step`` after every optimizer
step and ``after_epoch``, and ``after_train`` once at the end, also when the run stops with an error (``state.error``
then holds it). Each call gets the :class:`RunState`. The built-in hooks (:func:`default_hooks`), in this order:

* :class:`DivergenceCheck`: a NaN/inf loss stops the run before its step (:class:`RunFailed`; nothing of the epoch
  is saved);
* :class:`VerifyData`: read every sample once before training (``--verify-data`` reads them as the run is built);
* :class:`Evaluation`: score the model after every epoch (an evaluation that fails or is interrupted saves the
  trained epoch first, marked unevaluated: the resume evaluates it; an :class:`~encoding.errors.EncodingError` or
  ``OSError`` becomes a one-line :class:`RunFailed`, any other exception, a bug, keeps its traceback);
* :class:`SkippedSamples`: log how many bad samples the datasets skipped (``--skip-bad``);
* the user's hooks (``train(run, hooks=[...])``, ``run_training(config, hooks=[...])``): they see the evaluation,
  and the numbers they add to ``state.stats`` are saved and logged with the epoch;
* :class:`Checkpointer`: write the checkpoint atomically after every epoch, and ``model_best.pth`` when the epoch
  has the best ``(pixAcc + mIoU) / 2`` so far (before the log row); a state holding NaN/inf is never saved; the
  user's hooks' ``state_dict()`` is saved with it and given back to their ``load_state_dict()`` on resume;
* :class:`EpochLog`: the epoch's row in ``log.csv`` / ``log.jsonl`` (and TensorBoard / W&B);
* :class:`Previews`: preview images of validation predictions for TensorBoard / W&B;
* :class:`ConsoleLine`: one line per epoch on stdout;
* :class:`RunEstimate`: the whole run's estimated time, after its first iterations (and again after the first epoch
  when the measured epoch differs);
* :class:`CurvePlot`: ``curves.png`` from ``log.csv`` after the last epoch;
* :class:`StopOnSignal`: Ctrl-C, SIGTERM or SIGHUP saves a resumable checkpoint after the current iteration
  (:class:`~encoding.errors.RunInterrupted`, exit status 128 + signal); last, so every other hook saw the step.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import EncodingError, RunInterrupted
from ..utils.checkpoint import CHECKPOINT_NAME, NonFiniteError, save_checkpoint
from ..utils.dist import is_fully_sharded, is_main_process
from ..utils.logger import EpochLogger
from ..utils.curves import write_curves
from ..utils.rundir import remove_stale_temp_files
from .data import drop_bad_samples
from .directory import kept
from .loop import check_finite_loss, evaluate
from .signals import GracefulInterrupt, Interrupted
from .previews import validation_previews
from .sharding import full_state
from .state import Checkpoint, gathered_rng_states, hook_states, load_hook_states, restore_best, training_state

__all__ = ["RunFailed", "RunState", "Hook", "DivergenceCheck", "VerifyData", "Evaluation", "SkippedSamples",
           "Checkpointer", "EpochLog", "Previews", "ConsoleLine", "RunEstimate", "CurvePlot", "StopOnSignal",
           "default_hooks"]


class RunFailed(RuntimeError, EncodingError):
    """The run stopped with an error that the one-line report explains."""


@dataclass
class RunState:
    """What the hooks see of a running training.

    Attributes:
        run: the :class:`~.run.TrainingRun` (model, optimizer, loaders, ``output_dir``, ``epochs``...).
        checkpoint: the checkpoint the run resumed its training state from (``None``: a fresh run).
        epoch: the running epoch (counted from 0).
        iteration: training iterations done in ``epoch`` (counted from 1 after the first step; a resumed epoch
            starts at its saved iteration).
        step: the last step's ``{"loss", "lr"}`` (in ``before_step``: ``{"loss"}`` of the step about to be taken).
        stats: the epoch's averages (``loss``, ``lr``; ``pixAcc``, ``mIoU`` once evaluated): a hook may add
            numbers, they go into the log row.
        result: the last evaluation (``pixAcc``, ``mIoU``, ``IoU``...); ``{}`` before one.
        best: ``(best score, its epoch)`` so far; ``is_best``: the epoch just finished has it.
        error: the exception that is stopping the run, in ``after_train``; ``None`` otherwise.
        meters: the running epoch's ``loss`` / ``lr`` meters (saved with a mid-epoch checkpoint).
    """

    run: Any  # the TrainingRun (.run imports this module)
    checkpoint: Optional[Checkpoint] = None
    epoch: int = 0
    iteration: int = 0
    step: Dict[str, float] = field(default_factory=dict)
    stats: Dict[str, float] = field(default_factory=dict)
    result: Dict[str, Any] = field(default_factory=dict)
    best: Tuple[float, int] = (0.0, -1)
    is_best: bool = False
    error: Optional[BaseException] = None
    meters: Any = None  # a MetricLogger

    def row(self) -> Dict[str, Any]:
        """The epoch's log row: ``stats`` and the per-class IoU of ``result`` (``IoU/<class>``)."""
        ious = zip(self.run.class_names, self.result.get("IoU", ()))
        return {**self.stats, **{f"IoU/{name}": float(iou) for name, iou in ious}}


class Hook:
    """A rule of a run: override any of the six events (each gets the :class:`RunState`; the defaults do nothing).

    ``before_step`` runs after every forward, before the backward (``state.step["loss"]``; raising refuses the
    step: nothing of it is applied); ``after_step`` runs on every process after every optimizer step (the scheduler
    has stepped); ``after_train`` runs also when the run stops with an error (``state.error``), like a ``finally``.
    A user's hook may add ``state_dict()`` / ``load_state_dict(state)``: its state is saved with every checkpoint and
    given back on resume (after ``before_train``; :func:`~.state.hook_states`)."""

    def before_train(self, state: RunState) -> None:
        """Before the first epoch (after a resume restored the run)."""

    def before_epoch(self, state: RunState) -> None:
        """Before the epoch ``state.epoch`` trains."""

    def before_step(self, state: RunState) -> None:
        """After a forward, before its backward: ``state.iteration`` steps of the epoch are done, ``state.step``
        holds ``{"loss": ...}`` of the step about to be taken."""

    def after_step(self, state: RunState) -> None:
        """After an optimizer step: ``state.iteration`` steps of the epoch are done, ``state.step`` holds its loss."""

    def after_epoch(self, state: RunState) -> None:
        """After the epoch ``state.epoch`` trained (``state.stats``)."""

    def after_train(self, state: RunState) -> None:
        """Once at the end, also after an error (``state.error``)."""


class DivergenceCheck(Hook):
    """A NaN/inf loss stops the run before its step (:func:`~.loop.check_finite_loss`): :class:`RunFailed` names the
    epoch and the iteration and what was kept; nothing of the epoch is saved."""

    def before_step(self, state: RunState) -> None:
        try:
            check_finite_loss(state.step["loss"], state.epoch, state.iteration)
        except FloatingPointError as err:
            raise RunFailed(f"training diverged in epoch {state.epoch} ({err}); {kept(state.run.output_dir)}") from None


class VerifyData(Hook):
    """Read every sample once before training; a sample dropped here (``skip_bad``) is refused: loaders counted it."""

    def before_train(self, state: RunState) -> None:
        if dropped := drop_bad_samples(state.run.datasets()):
            raise RunFailed(f"verify: {dropped} bad sample(s) dropped after the loaders counted them: build the run "
                            "with verify_data=True in its configuration (other samples would fill their places)")


class Checkpointer(Hook):
    """The checkpoint after every epoch, and ``model_best.pth`` when the epoch has the best ``(pixAcc + mIoU) / 2``
    so far; the other rules save through :meth:`write_checkpoint` (an interrupt, a failed evaluation). The states of
    the user's ``hooks`` go with every checkpoint, and back to them on resume (:func:`~.state.hook_states`)."""

    def __init__(self, hooks: Sequence[Hook] = ()) -> None:
        self.hooks = list(hooks)

    def before_train(self, state: RunState) -> None:
        if state.checkpoint is not None:  # after the user's hooks' before_train (they come first)
            load_hook_states(self.hooks, state.checkpoint.data.get("hooks"))
        if is_main_process():
            remove_stale_temp_files(state.run.output_dir)
            if state.checkpoint is not None:
                restore_best(state.run.output_dir, state.checkpoint)

    def after_epoch(self, state: RunState) -> None:
        score = (state.stats.get("pixAcc", 0.0) + state.stats.get("mIoU", 0.0)) / 2  # first evaluated: best, even 0
        state.is_best = "pixAcc" in state.stats and (score > state.best[0] or state.best[1] < 0)
        if state.is_best:
            state.best = (score, state.epoch)
        self.write_checkpoint(state, state.epoch, metrics=state.result, is_best=state.is_best, log_row=state.row())

    def write_checkpoint(self, state: RunState, epoch: int, *, iteration: int = 0,
                         metrics: Optional[Mapping[str, Any]] = None, is_best: bool = False,
                         log_row: Optional[Mapping[str, Any]] = None, unevaluated: Optional[Mapping[str, Any]] = None,
                         rng_ranks: Any = ...) -> str:
        """Write the checkpoint of ``epoch`` (``iteration`` steps into the next one, with their loss / lr totals;
        ``unevaluated``: the epoch's training numbers, its evaluation not done; ``rng_ranks``: every rank's RNG states
        gathered earlier, ``...``: gathered here). Every rank calls it (collectives), the main process writes; a
        diverged state is refused, keeping the last good file (:class:`RunFailed` names the tensor and what was kept).
        """
        run = state.run
        path = os.path.join(run.output_dir, CHECKPOINT_NAME)
        model, optimizer = full_state(run.model, run.optimizer)  # every rank: fsdp / zero1 gather onto rank 0
        rng_ranks = gathered_rng_states() if rng_ranks is ... else rng_ranks  # each rank resumes its own
        totals = state.meters.totals(across_processes=True) if iteration and state.meters is not None else None
        if not is_main_process():
            return path
        saved = training_state(model, optimizer, run.scheduler, run.scaler, epoch=epoch, iteration=iteration,
                               best_pred=state.best[0], best_epoch=state.best[1], args=run.options,
                               metrics=metrics or {}, log_row=log_row, unevaluated=unevaluated,
                               rng_ranks=rng_ranks, hooks=hook_states(self.hooks), totals=totals)
        try:
            return save_checkpoint(saved, run.output_dir, is_best)
        except NonFiniteError as err:
            where = (f"epoch {epoch + 1} by iteration {iteration}" if iteration
                     else f"epoch {epoch} by iteration {len(run.train_loader)}, its last")
            raise RunFailed(f"training diverged in {where} (iterations counted from 1): {err.tensor} (try a lower "
                            f"--lr or --clip-grad); {kept(run.output_dir)}") from None


class StopOnSignal(Hook):
    """Ctrl-C, SIGTERM or SIGHUP: finish the current iteration, save a resumable checkpoint and stop
    (:class:`~encoding.errors.RunInterrupted`, exit status 128 + signal). Under ``torchrun`` every rank stops at the
    same iteration (:meth:`~.signals.GracefulInterrupt.poll` agrees across processes) and the main process saves."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer
        self.signals = GracefulInterrupt()

    def before_train(self, state: RunState) -> None:
        self.signals.__enter__()

    def after_step(self, state: RunState) -> None:
        if self.signals.poll():
            path = self.checkpointer.write_checkpoint(state, state.epoch - 1, iteration=state.iteration)
            raise self.stopped(f"in epoch {state.epoch} after iteration {state.iteration}; saved {path} (continue "
                               f"with --resume {path})")

    def after_epoch(self, state: RunState) -> None:
        if state.epoch + 1 < state.run.epochs and self.signals.poll():  # under DDP, evaluation is not interrupted
            path = os.path.join(state.run.output_dir, CHECKPOINT_NAME)
            raise self.stopped(f"after epoch {state.epoch}; saved {path} (continue with --resume {path})")

    def after_train(self, state: RunState) -> None:
        self.signals.__exit__(None, None, None)

    def stopped(self, where: str) -> RunInterrupted:
        """The exception that ends the run after a signal, ``where`` saying what was saved."""
        signum = self.signals.signum
        by = "" if signum in (None, signal.SIGINT) else f" by {signal.Signals(signum).name}"
        return RunInterrupted(f"interrupted{by} {where}", self.signals.exit_status)


class Evaluation(Hook):
    """Score the model on the validation loader after every epoch (``state.result``; ``pixAcc``, ``mIoU`` (and a
    binary run's ``fgIoU``) join ``state.stats``). An interrupt or a failure during the evaluation saves the trained
    epoch first, marked unevaluated with its training numbers (the resume evaluates, ranks and logs it before the
    next epoch); a failure the package explains (:class:`~encoding.errors.EncodingError`, ``OSError``) is then a
    one-line :class:`RunFailed`, while any other exception is a bug and propagates with its traceback."""

    def __init__(self, checkpointer: Checkpointer, stop: StopOnSignal) -> None:
        self.checkpointer, self.stop = checkpointer, stop

    def after_epoch(self, state: RunState) -> None:
        run, epoch = state.run, state.epoch
        if not run.validate:
            return
        ranks = gathered_rng_states()  # every rank, now (evaluating draws none): a failure saves without a collective
        try:
            state.result = evaluate(run.model, run.val_loader, run.metric, run.input_device, run.amp_dtype,
                                    stop=None if run.distributed else self.stop.signals.requested, epoch=epoch)
        except Interrupted:
            path = self.checkpointer.write_checkpoint(state, epoch, unevaluated=state.stats, rng_ranks=ranks)
            raise self.stop.stopped(f"while evaluating epoch {epoch}; its training is saved in {path} (continue "
                                    f"with --resume {path})") from None
        except Exception as err:  # the trained epoch is saved before the failure is reported
            path = self.checkpointer.write_checkpoint(state, epoch, unevaluated=state.stats, rng_ranks=ranks)
            if isinstance(err, (EncodingError, OSError)):  # explained in one line
                raise RunFailed(f"evaluation after epoch {epoch} failed ({err}); the trained epoch is saved in "
                                f"{path}") from err
            if is_main_process():  # a bug: it keeps its traceback
                print(f"evaluation after epoch {epoch} failed; the trained epoch is saved in {path}", file=sys.stderr)
            raise
        scores = ("pixAcc", "mIoU", "fgIoU")  # fgIoU: a binary run's
        state.stats.update({k: state.result[k] for k in scores if k in state.result})


class SkippedSamples(Hook):
    """Log how many bad samples the datasets skipped (``skipped``; ``--skip-bad``)."""

    def after_epoch(self, state: RunState) -> None:
        state.stats["skipped"] = sum(d.num_skipped for d in state.run.datasets())


class EpochLog(Hook):
    """The epoch's row (:meth:`RunState.row`) in ``log.csv`` and ``log.jsonl``, and TensorBoard / W&B when the run's
    ``log_options`` ask (:class:`~encoding.utils.logger.EpochLogger`); a resumed log ends at its checkpoint."""

    def __init__(self) -> None:
        self.log: Optional[EpochLogger] = None

    def before_train(self, state: RunState) -> None:
        self.log = EpochLogger(state.run.output_dir, **state.run.log_options)
        if is_main_process() and state.checkpoint is not None:
            self.log.resume_after(*state.checkpoint.log_resume())

    def after_epoch(self, state: RunState) -> None:
        self.log.write(state.epoch, **state.row())

    def after_train(self, state: RunState) -> None:
        if self.log is not None:
            self.log.close()


class Previews(Hook):
    """Every ``run.log_images`` epochs (and after the last), previews of validation predictions go to TensorBoard /
    W&B (:func:`~.previews.validation_previews`): the main process's, all processes running their forwards in FSDP."""

    def __init__(self, log: EpochLog) -> None:
        self.log = log

    def after_epoch(self, state: RunState) -> None:
        run, epoch, log = state.run, state.epoch, self.log.log
        wanted = run.log_options.get("tensorboard") or run.log_options.get("wandb")  # the same on every process
        due = run.log_images and (epoch % run.log_images == 0 or epoch + 1 == run.epochs)
        if wanted and due and (log.sinks or is_fully_sharded(run.model)):
            palette = run.options.get("palette") or run.options["dataset"]
            log.images(epoch, validation_previews(run.model, run.datasets()[1], palette))


class ConsoleLine(Hook):
    """One line per epoch on stdout (main process): ``epoch N: loss ..., lr ..., pixAcc ..., mIoU ...``."""

    def after_epoch(self, state: RunState) -> None:
        if is_main_process():
            print(f"epoch {state.epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in state.stats.items()))


def _duration(seconds: float) -> str:
    """``45 s``, ``40 min``, ``2 h 05 min``: a time as people read an estimate."""
    if seconds < 90:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60:02d} min"


class RunEstimate(Hook):
    """The whole run's time on stdout (main process), once its first iterations are timed: ``estimated whole run:
    ~40 min (50 epochs x 48 s)``, the epochs left times an epoch's time: its training iterations at the pace of
    the steps after the first (which warms up) over a tenth of the epoch (:meth:`measured_steps`), plus its
    validation at a third of a training step per batch of samples (a forward without its backward). After the first
    epoch, validation measured, the line comes again when the measured epoch differs by more than a quarter (or
    first, when the epoch was too short to time)."""

    MEASURED = 3

    def before_train(self, state: RunState) -> None:  # an epoch resumed mid-way is not timed: the next one is
        self.first, self.steps, self.epoch_time = state.epoch + bool(state.run.start.iteration), 0, None
        self.epochs = state.run.epochs - self.first

    def before_epoch(self, state: RunState) -> None:
        self.started = time.perf_counter()

    def after_step(self, state: RunState) -> None:
        self.steps += 1
        measured = self.measured_steps(len(state.run.train_loader))
        if self.steps == 1:
            self.timed = time.perf_counter()
        elif self.steps == 1 + measured and state.epoch == self.first:
            step = (time.perf_counter() - self.timed) / measured
            self.epoch_time = step * (len(state.run.train_loader) + self._validation_steps(state.run) / 3)
            self.report("")

    def after_epoch(self, state: RunState) -> None:
        if state.epoch != self.first:
            return
        measured, estimated = time.perf_counter() - self.started, self.epoch_time
        if estimated is None or abs(measured - estimated) > estimated / 4:
            self.epoch_time = measured
            self.report(f"; epoch {state.epoch} measured")

    @classmethod
    def measured_steps(cls, steps_per_epoch: int) -> int:
        """How many steps after the first are timed: a tenth of the epoch, at least :attr:`MEASURED` (a few steps
        alone are at the mercy of the data loader's start and of a busy machine)."""
        return max(cls.MEASURED, steps_per_epoch // 10)

    @staticmethod
    def _validation_steps(run: Any) -> float:
        """The validation of an epoch in training batches (its samples over the training batch size)."""
        if not run.validate:
            return 0.0
        return len(run.val_loader) * (run.val_loader.batch_size or 1) / (run.train_loader.batch_size or 1)

    def report(self, note: str) -> None:
        """Print the estimate (main process)."""
        if is_main_process():
            print(f"estimated whole run: ~{_duration(self.epochs * self.epoch_time)} ({self.epochs} epochs x "
                  f"{_duration(self.epoch_time)}{note})", flush=True)


class CurvePlot(Hook):
    """``curves.png`` beside ``log.csv`` when the run ends without an error
    (:func:`~encoding.utils.curves.write_curves`)."""

    def __init__(self, log: EpochLog) -> None:
        self.log = log

    def after_train(self, state: RunState) -> None:
        log = self.log.log
        if state.error is None and is_main_process() and log is not None and log.csv_path:
            write_curves(log.csv_path)


def default_hooks(run: Any, *, verify_data: bool = False, user: Sequence[Hook] = ()) -> List[Hook]:
    """The rules of ``run`` as hooks, in their order, with the ``user`` hooks after the evaluation and before the
    checkpoint: what they add to ``state.stats`` is saved and logged with the epoch."""
    checkpointer, log = Checkpointer(user), EpochLog()
    stop = StopOnSignal(checkpointer)
    hooks: List[Hook] = [DivergenceCheck()] + ([VerifyData()] if verify_data else [])
    hooks += [Evaluation(checkpointer, stop)] + ([SkippedSamples()] if run.count_skipped else []) + list(user)
    return hooks + [checkpointer, log, Previews(log), ConsoleLine(), RunEstimate(), CurvePlot(log), stop]
