"""encoding.engine: the loops (:mod:`.loop`), a training run (:mod:`.run`, its rules as hooks in :mod:`.hooks`, its
checkpoint schema in :mod:`.state`),
runs built from a configuration (:mod:`.config`), a network back from its checkpoint (:mod:`.loading`:
:func:`load_model`), segmenting images (:mod:`.predict`: :func:`segment`) and the scripts' inference helpers
(:mod:`.inference`).

The loops are device-agnostic: ``model`` may be a plain module, a :class:`~encoding.parallel.DataParallelModel` or a
DDP module. See ``docs/training.md``.
"""
from .loop import (GracefulInterrupt, Interrupted, autocast_context, backward_step, evaluate, evaluate_images,
                   param_groups, predicted_labels, train_one_epoch)
from .hooks import Hook, RunState
from .run import RunFailed, RunInterrupted, TrainingRun, train
from .config import TrainingConfig, build_training, run_training
from .loading import ModelInfo, load_model, model_info
from .predict import inference_module, segment
from .compiled import compile_model
from .hub import load_pretrained, push_to_hub, save_pretrained

__all__ = ["param_groups", "autocast_context", "backward_step", "train_one_epoch", "evaluate", "evaluate_images",
           "predicted_labels", "Interrupted", "GracefulInterrupt", "TrainingRun", "RunFailed", "RunInterrupted",
           "Hook", "RunState", "train", "TrainingConfig", "build_training", "run_training", "ModelInfo", "load_model",
           "model_info", "inference_module", "segment", "compile_model", "save_pretrained", "load_pretrained", "push_to_hub"]
