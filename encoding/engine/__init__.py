"""encoding.engine: the training and evaluation loops (:mod:`.loop`) and inference helpers (:mod:`.inference`).

The loops are device-agnostic: ``model`` may be a plain module, a :class:`~encoding.parallel.DataParallelModel` or a
DDP module. See ``docs/training.md``.
"""
from .loop import (GracefulInterrupt, Interrupted, autocast_context, backward_step, evaluate, evaluate_images,
                   param_groups, predicted_labels, train_one_epoch)

__all__ = ["param_groups", "autocast_context", "backward_step", "train_one_epoch", "evaluate", "evaluate_images",
           "predicted_labels", "Interrupted", "GracefulInterrupt"]
