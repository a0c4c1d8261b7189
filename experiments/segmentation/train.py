"""Train a segmentation model; by default FCN-ResNet18 on the embedded `shapes` dataset (CPU when no GPU).

    python experiments/segmentation/train.py                                  # shapes, all GPUs or CPU
    python experiments/segmentation/train.py --dataset ade20k --model encnet --backbone resnet50 --aux --se-loss
    torchrun --nproc_per_node 4 experiments/segmentation/train.py --dataset citys ...   # DDP

One process drives all local GPUs with DataParallelModel + DataParallelCriterion (ungathered outputs, exact
loss reduction, SyncBatchNorm across replicas); under torchrun each process owns one device (DDP).

Reliability (docs/training.md, "Reliability"): the run directory is locked; a checkpoint is written atomically after
every epoch (never with NaN/inf inside); Ctrl-C saves a resumable mid-epoch checkpoint and exits with 130; resuming
continues bitwise where the run stopped. Errors end the run with one line on stderr and exit status 1.
"""
import contextlib
import os
import sys
import time
from typing import Any, Dict, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from option import EXIT_INTERRUPTED, parse_args, run_cli  # noqa: E402

from assemble import TrainingRun, build_run, run_directory  # noqa: E402
from encoding.datasets import DatasetError  # noqa: E402
from encoding.engine import GracefulInterrupt, Interrupted, evaluate, train_one_epoch  # noqa: E402
from encoding.utils import (CheckpointError, EpochLogger, format_table, is_main_process, load_checkpoint,  # noqa: E402
                            save_checkpoint)
from encoding.utils.checkpoint import CHECKPOINT_NAME, NonFiniteError, restore_best  # noqa: E402
from encoding.utils.determinism import enable_determinism  # noqa: E402
from encoding.utils.rundir import RunDirLock, RunDirLocked, remove_stale_temp_files  # noqa: E402

class RunFailed(RuntimeError):
    """The run stopped with an error that the one-line report explains."""


class RunInterrupted(SystemExit):
    """Ctrl-C: a resumable checkpoint was written; exit status 130."""

    def __init__(self, message: str) -> None:
        super().__init__(EXIT_INTERRUPTED)
        self.message = message


def _finished(args) -> Optional[str]:
    """A message when ``--resume`` names a checkpoint that already completed ``--epochs`` epochs."""
    if not args.resume or args.eval or args.ft:
        return None
    checkpoint = load_checkpoint(args.resume, map_location="cpu")
    done = checkpoint.get("epoch", -1) + 1
    if done >= args.epochs and not checkpoint.get("iteration", 0):
        return (f"nothing to do: {args.resume} already completed {done} of --epochs {args.epochs}; "
                "raise --epochs to train further")
    return None


def _save(run: TrainingRun, epoch: int, best_pred: float, best_epoch: int, metrics: Dict[str, Any],
          is_best: bool = False, iteration: int = 0, log_row: Optional[Dict[str, Any]] = None) -> str:
    """Write the checkpoint (main process only); a diverged state is refused, keeping the last good file."""
    path = os.path.join(run.output_dir, CHECKPOINT_NAME)
    if not is_main_process():
        return path
    state = run.checkpoint_state(epoch, best_pred, best_epoch, metrics, iteration, log_row)
    try:
        return save_checkpoint(state, run.output_dir, is_best)
    except NonFiniteError as err:
        raise RunFailed(f"training diverged in epoch {epoch + (1 if iteration else 0)}: {err.tensor} (try a lower "
                        f"--lr or --clip-grad); {_kept(run)}") from None


def _kept(run: TrainingRun) -> str:
    """What a diverged run leaves behind."""
    path = os.path.join(run.output_dir, CHECKPOINT_NAME)
    return f"the last good checkpoint {path} is kept" if os.path.isfile(path) else "no checkpoint was written"


def _prepare_data(run: TrainingRun) -> None:
    """``--verify-data``: read every sample once, before training."""
    for dataset in run.datasets():
        bad = dataset.verify()
        if bad and is_main_process():
            print(f"verify: dropped {bad} bad sample(s) of {dataset.split!r} (--skip-bad)")


def _skipped(run: TrainingRun) -> Dict[str, int]:
    return {"skipped": sum(d.num_skipped for d in run.datasets())} if run.args.skip_bad else {}


def _train(run: TrainingRun, log: EpochLogger, interrupt: GracefulInterrupt) -> Dict[str, Any]:
    """The epoch loop: train, evaluate, save (checkpoint first, then the log row)."""
    args, result = run.args, {}
    best_pred, best_epoch = run.best_pred, run.best_epoch
    for epoch in range(run.start_epoch, args.epochs):
        start = run.start_iteration if epoch == run.start_epoch else 0
        run.set_epoch(epoch, start)
        try:
            stats = train_one_epoch(run.model, run.criterion, run.optimizer, run.train_loader, run.scheduler, epoch,
                                    run.input_device, run.scaler, run.amp_dtype, args.clip_grad, best_pred,
                                    start_iteration=start, stop=interrupt.requested)
        except Interrupted as stop:
            path = _save(run, epoch - 1, best_pred, best_epoch, {}, iteration=stop.iteration)
            raise RunInterrupted(f"interrupted in epoch {epoch} after iteration {stop.iteration}; saved {path} "
                                 f"(continue with --resume {path})") from None
        except FloatingPointError as err:  # a NaN/inf loss: nothing of this epoch is saved
            raise RunFailed(f"training diverged in epoch {epoch} ({err}); {_kept(run)}") from None
        try:
            if not args.no_val:
                result = evaluate(run.model, run.val_loader, run.metric, run.input_device, run.amp_dtype,
                                  stop=interrupt.requested, epoch=epoch)
                stats.update(pixAcc=result["pixAcc"], mIoU=result["mIoU"])
        except Interrupted:
            path = _save(run, epoch, best_pred, best_epoch, {})
            raise RunInterrupted(f"interrupted while evaluating epoch {epoch}; its training is saved in {path} "
                                 f"(continue with --resume {path})") from None
        except Exception as err:  # the trained epoch is saved before the failure is reported
            path = _save(run, epoch, best_pred, best_epoch, {})
            raise RunFailed(f"evaluation after epoch {epoch} failed ({err}); the trained epoch is saved in "
                            f"{path}") from err
        stats.update(_skipped(run))
        new_pred = (stats.get("pixAcc", 0.0) + stats.get("mIoU", 0.0)) / 2
        is_best = new_pred > best_pred
        if is_best:
            best_pred, best_epoch = new_pred, epoch
        _save(run, epoch, best_pred, best_epoch, result, is_best, log_row=stats)
        log.write(epoch, **stats)
        if is_main_process():
            print(f"epoch {epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in stats.items()))
    return result


def _lock(args) -> contextlib.AbstractContextManager:
    """The run directory's lock on the main process (rank 0 under torchrun); nothing elsewhere."""
    if args.eval or int(os.environ.get("RANK", "0")) != 0:
        return contextlib.nullcontext()
    return RunDirLock(run_directory(args))


def main(argv=None) -> dict:
    """Run ``train.py`` with ``argv``; returns the last evaluation result.

    Raises:
        RunFailed, RunDirLocked, CheckpointError, DatasetError, OSError: reported in one line by :func:`cli`.
        RunInterrupted: Ctrl-C; a resumable checkpoint was written (a ``SystemExit`` with status 130).
    """
    started = time.perf_counter()
    args = parse_args(argv)
    if args.deterministic:
        enable_determinism()
    finished = _finished(args)
    if finished:
        print(finished)
        return {}
    with _lock(args):  # before any work: refuses a second run and an unwritable directory
        run = build_run(args)
        if is_main_process():
            print(run.describe())
        if args.eval:
            result = evaluate(run.model, run.val_loader, run.metric, run.input_device, run.amp_dtype)
            if is_main_process():
                print(format_table(result, run.class_names))
            return result
        if args.verify_data:
            _prepare_data(run)
        with GracefulInterrupt() as interrupt, EpochLogger(run.output_dir) as log:
            if is_main_process():
                remove_stale_temp_files(run.output_dir)
                if args.resume and not args.ft:
                    restore_best(run.output_dir)
                    checkpoint = load_checkpoint(args.resume, map_location="cpu")
                    log.resume_after(checkpoint.get("epoch", -1), checkpoint.get("log_row"))
            result = _train(run, log, interrupt)
    if result and is_main_process():
        print(format_table(result, run.class_names))
        print(f"done in {time.perf_counter() - started:.1f} s: pixAcc {result['pixAcc']:.4f}, mIoU {result['mIoU']:.4f}")
    return result


def cli(argv=None) -> int:
    """``main`` for the command line: known failures become one line on stderr; returns the exit status."""
    try:
        return run_cli("train.py", main, argv, (RunFailed, RunDirLocked, CheckpointError, DatasetError, OSError),
                       interrupted="interrupted before training started; nothing was saved")
    except RunInterrupted as stop:  # Ctrl-C inside the loop: a resumable checkpoint was written
        sys.stderr.write(f"train.py: {stop.message}\n")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(cli())
