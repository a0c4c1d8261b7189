"""encoding.engine: training. The loops (:mod:`.loop`), a training run (:mod:`.run`, its rules as hooks in
:mod:`.hooks`, its checkpoint schema in :mod:`.state`, fsdp / zero1 states in :mod:`.sharding`), the typed builders
(:mod:`.builders`) and a run checked and assembled from its configuration (:mod:`.assemble`: :func:`run_training`).

Using a trained network (:func:`~encoding.inference.load_model`, :func:`~encoding.inference.segment`, evaluation,
the demo, model folders and the Hub) is :mod:`encoding.inference`'s, above this package.

The loops are device-agnostic: ``model`` may be a plain module, a :class:`~encoding.parallel.DataParallelModel` or a
DDP module. See ``docs/training.md``.
"""
from .loop import (autocast_context, backward_step, evaluate, evaluate_images, param_groups, predicted_labels,
                   train_one_epoch)
from .signals import GracefulInterrupt, Interrupted
from .hooks import Hook, RunState
from .run import RunFailed, RunInterrupted, TrainingRun, train
from .assemble import TrainingConfig, build_training, run_training
from .compiled import compile_model

__all__ = ["param_groups", "autocast_context", "backward_step", "train_one_epoch", "evaluate", "evaluate_images",
           "predicted_labels", "Interrupted", "GracefulInterrupt", "TrainingRun", "RunFailed", "RunInterrupted",
           "Hook", "RunState", "train", "TrainingConfig", "build_training", "run_training", "compile_model"]
