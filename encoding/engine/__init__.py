"""encoding.engine: the loops (:mod:`.loop`), a training run (:mod:`.run`, its checkpoint schema in :mod:`.state`),
runs built from a configuration (:mod:`.config`) and inference helpers (:mod:`.inference`).

The loops are device-agnostic: ``model`` may be a plain module, a :class:`~encoding.parallel.DataParallelModel` or a
DDP module. See ``docs/training.md``.
"""
from .loop import (GracefulInterrupt, Interrupted, autocast_context, backward_step, evaluate, evaluate_images,
                   param_groups, predicted_labels, train_one_epoch)
from .run import RunFailed, RunInterrupted, TrainingRun, train
from .config import TrainingConfig, build_training, run_training

__all__ = ["param_groups", "autocast_context", "backward_step", "train_one_epoch", "evaluate", "evaluate_images",
           "predicted_labels", "Interrupted", "GracefulInterrupt", "TrainingRun", "RunFailed", "RunInterrupted",
           "train", "TrainingConfig", "build_training", "run_training"]
