"""encoding.legacy: the names and conventions of PyTorch-Encoding (PE), Synchronized-BatchNorm (vacancy) and mmcv.

Every old name is declared once, beside its object, with the module(s) where users import it
(:func:`~encoding.legacy.declare.old_name`): ``@old_name("encoding.nn", new="encoding.nn.SyncBatchNorm")`` above
``class BatchNorm2d``. Importing this package (``import encoding`` does, last) imports the declaring modules, which
bind each name in its modules; :data:`ALIASES` (module -> {old name: object}) is what they declared. A name with a new
spelling emits one ``EncodingDeprecationWarning`` (a ``FutureWarning``) naming it when used. No core module knows
about these names, and no module resolves names lazily (no module ``__getattr__``).

Declaring modules (each on the core it is built on), imported with this package:

* :mod:`.scheduler`: ``LR_Scheduler`` / ``LR_Scheduler_Head`` (PE's ``scheduler(optimizer, i, epoch, best_pred)``)
  on ``utils.lr_scheduler.IterationLR``.
* :mod:`.metrics`: ``batch_pix_accuracy``, ``batch_intersection_union``, ``pixel_accuracy``,
  ``intersection_and_union``, on ``utils.metrics.confusion_matrix``; ``accuracy`` (top-k), ``get_pixacc_miou``.
* :mod:`.helpers`: ``get_mask_pallete`` (``utils.palette.colorize``), ``mkdir`` and ``check_sha1`` (``utils.files``),
  ``load_image`` (``datasets.base.read_rgb``).
* :mod:`.training`: ``MixUpWrapper``, ``get_selabel_vector`` (the SE loss's class presence), ``torch_dist_sum``
  (``utils.dist.reduce_across_processes``).
* :mod:`.batchnorm`: ``BatchNorm1d/2d/3d`` = ``SynchronizedBatchNorm1d/2d/3d``, ``convert_model``,
  ``patch_sync_batchnorm``, ``revert_sync_batchnorm``, ``set_sbn_eps_mode``, on ``nn.SyncBatchNorm``.
* :mod:`.layers`: ``GlobalAvgPool2d``, ``View``, ``Sum``, ``Mean``, ``Normalize``, ``ConcurrentModule``,
  ``GramMatrix``, ``DropBlock2D``, ``LabelSmoothing``, ``EncodingDrop``, ... (torch, ``nn.Encoding``).
* :mod:`.basenet`: PE's ``BaseNet`` (``encoding.models``, ``encoding.models.base``), the base class of PE users' own
  networks, on ``models.backbone.get_backbone``.
* :mod:`.wrappers`: mmcv's ``is_module_wrapper`` and ``MODULE_WRAPPERS``, on ``parallel``.
* :mod:`.aliases`: core objects under old names (``get_dataset``, ``DistSyncBatchNorm``, ``download``, the heads PE
  exported from ``encoding.nn``, the preparation names the dataset modules had).

Rooms not imported by this package: the first two are PE's module paths ``encoding.functions`` /
``encoding.transforms``, which ``import encoding`` imports after this package (as PE's ``__init__`` did); the third
is imported only when used:

* :mod:`.functions`: PE's functional forms (``scaled_l2``, ``aggregate``, ``syncbatchnorm``, ``batchnormtrain``,
  ``NonMaxSuppression``, ...).
* :mod:`.transforms`: PE's classification transforms (``get_transform``, ``Lighting``) on torchvision.
* :mod:`.outputs`: ``tuple_outputs(model)`` / ``pe_tuple(outputs)``: PE's ``(out[, se][, aux])`` output tuples.

PE's loss argument layouts are the core losses' own (:func:`encoding.nn.loss.loss_inputs`): one
``SegmentationLosses``. ``docs/migration.md`` lists every name, where users import it and its status.
"""
from __future__ import annotations

from typing import Any, Dict

from ..nn.loss import OhemCrossEntropy, SegmentationLosses, loss_inputs
from . import aliases, basenet, batchnorm, helpers, layers, metrics, scheduler, training, wrappers
from .basenet import BaseNet
from .batchnorm import (BatchNorm1d, BatchNorm2d, BatchNorm3d, SynchronizedBatchNorm1d, SynchronizedBatchNorm2d,
                        SynchronizedBatchNorm3d, convert_model, patch_sync_batchnorm, revert_sync_batchnorm,
                        set_sbn_eps_mode)
from .declare import DECLARED
from .helpers import check_sha1, get_mask_pallete, load_image, mkdir
from .layers import (ConcurrentModule, ConvBnAct, DropBlock2D, EncodingCosine, EncodingDrop, GlobalAvgPool2d,
                     GramMatrix, Inspiration, LabelSmoothing, Mean, NLLMultiLabelSmooth, Normalize, Sum,
                     UpsampleConv2d, View)
from .metrics import (accuracy, batch_intersection_union, batch_pix_accuracy, get_pixacc_miou, intersection_and_union,
                      pixel_accuracy)
from .scheduler import LR_Scheduler, LR_Scheduler_Head
from .training import MixUpWrapper, get_selabel_vector, torch_dist_sum
from .wrappers import MODULE_WRAPPERS, is_module_wrapper

__all__ = [
    "ALIASES",
    "LR_Scheduler", "LR_Scheduler_Head", "loss_inputs", "SegmentationLosses", "OhemCrossEntropy",
    "batch_pix_accuracy", "batch_intersection_union", "pixel_accuracy", "intersection_and_union", "accuracy",
    "get_pixacc_miou", "get_mask_pallete", "mkdir", "check_sha1", "load_image",
    "MixUpWrapper", "get_selabel_vector", "torch_dist_sum",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SynchronizedBatchNorm1d", "SynchronizedBatchNorm2d",
    "SynchronizedBatchNorm3d", "convert_model", "patch_sync_batchnorm", "revert_sync_batchnorm", "set_sbn_eps_mode",
    "GlobalAvgPool2d", "View", "Sum", "Mean", "Normalize", "ConcurrentModule", "GramMatrix", "DropBlock2D",
    "LabelSmoothing", "EncodingDrop", "UpsampleConv2d", "Inspiration", "EncodingCosine", "ConvBnAct",
    "NLLMultiLabelSmooth", "MODULE_WRAPPERS", "is_module_wrapper", "BaseNet",
    "aliases", "basenet", "batchnorm", "helpers", "layers", "metrics", "scheduler", "training", "wrappers",
]

#: Module -> {old name: the object it names there}: every old name, once per module users import it from (what the
#: declarations bound; ``docs/migration.md`` documents them).
ALIASES: Dict[str, Dict[str, Any]] = DECLARED
