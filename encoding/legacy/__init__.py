"""encoding.legacy: the names and conventions of PyTorch-Encoding (PE), Synchronized-BatchNorm (vacancy) and mmcv.

Everything a user of those projects imports is defined here (or is a core object under an old name) and listed
once in :data:`ALIASES`; :func:`install` — called at the end of ``encoding/__init__.py`` — binds each name in the
module where users import it. No core module knows about these names: the core has one convention per feature, and
the second ones live here.

Modules (each name on the core it is built on):

* :mod:`.scheduler`: ``LR_Scheduler`` (optimizer optional, ``scheduler(optimizer, i, epoch, best_pred)``) and
  ``LR_Scheduler_Head``, on the torch-style ``utils.lr_scheduler.IterationLR`` (``step()`` per iteration).
* :mod:`.loss`: ``SegmentationLosses`` / ``OhemCrossEntropy``, the core ``nn.loss`` classes (which take
  ``criterion(output_dict_or_tensor, target)``) also accepting ``(out[, se][, aux])`` tuples and the flat call
  ``criterion(out, se, aux, target)``; ``loss_inputs`` adapts those layouts.
* :mod:`.metrics`: ``batch_pix_accuracy``, ``batch_intersection_union``, ``pixel_accuracy``,
  ``intersection_and_union``, on ``utils.metrics.confusion_matrix``.
* :mod:`.helpers`: ``get_mask_pallete`` (``utils.palette.colorize``), ``mkdir`` and ``check_sha1`` (``utils.files``).
* :mod:`.batchnorm`: ``BatchNorm1d/2d/3d`` = ``SynchronizedBatchNorm1d/2d/3d``, ``convert_model``,
  ``patch_sync_batchnorm``, ``revert_sync_batchnorm``, on ``nn.SyncBatchNorm``.
* :mod:`.layers`: ``GlobalAvgPool2d``, ``View``, ``Sum``, ``Mean``, ``Normalize``, ``ConcurrentModule``,
  ``GramMatrix``, ``DropBlock2D``, ``LabelSmoothing``, ``EncodingDrop`` (torch, ``nn.Encoding``).
* :mod:`.wrappers`: mmcv's ``is_module_wrapper`` and ``MODULE_WRAPPERS``, on ``parallel``.
* :mod:`.functional`: ``batchnormtrain`` and ``NonMaxSuppression`` (``encoding.functions``, the latter on
  ``torchvision.ops.nms``) and vacancy's ``set_sbn_eps_mode`` (``encoding.nn``).
* :mod:`.outputs`: ``tuple_outputs(model)`` / ``pe_tuple(outputs)``: PE's ``(out[, se][, aux])`` output tuples.

Plain aliases of core objects (``get_dataset``, ``DistSyncBatchNorm``, ``download``, the heads PE exported from
``encoding.nn``, the preparation names the dataset modules had) are only entries of :data:`ALIASES`.
``docs/migration.md`` lists every name, where users import it and its status. ``encoding.functions`` and
``encoding.transforms`` keep PE's functional forms and classification transforms under PE's own module paths.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict

from .. import datasets, models, nn, utils
from ..datasets import prepare
from . import batchnorm, functional, helpers, layers, loss, metrics, outputs, scheduler, wrappers
from .batchnorm import (BatchNorm1d, BatchNorm2d, BatchNorm3d, SynchronizedBatchNorm1d, SynchronizedBatchNorm2d,
                        SynchronizedBatchNorm3d, convert_model, patch_sync_batchnorm, revert_sync_batchnorm)
from .functional import NonMaxSuppression, batchnormtrain, set_sbn_eps_mode
from .helpers import check_sha1, get_mask_pallete, mkdir
from .layers import (ConcurrentModule, ConvBnAct, DropBlock2D, EncodingCosine, EncodingDrop, GlobalAvgPool2d,
                     GramMatrix, Inspiration, LabelSmoothing, Mean, NLLMultiLabelSmooth, Normalize, Sum,
                     UpsampleConv2d, View)
from .loss import OhemCrossEntropy, SegmentationLosses, loss_inputs
from .metrics import batch_intersection_union, batch_pix_accuracy, intersection_and_union, pixel_accuracy
from .outputs import pe_tuple, tuple_outputs
from .scheduler import LR_Scheduler, LR_Scheduler_Head
from .wrappers import MODULE_WRAPPERS, is_module_wrapper
from ..datasets.prepare.download import download


__all__ = [
    "ALIASES", "install",
    "LR_Scheduler", "LR_Scheduler_Head", "loss_inputs", "SegmentationLosses", "OhemCrossEntropy",
    "batch_pix_accuracy", "batch_intersection_union", "pixel_accuracy", "intersection_and_union",
    "get_mask_pallete", "mkdir", "check_sha1",
    "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SynchronizedBatchNorm1d", "SynchronizedBatchNorm2d",
    "SynchronizedBatchNorm3d", "convert_model", "patch_sync_batchnorm", "revert_sync_batchnorm",
    "GlobalAvgPool2d", "View", "Sum", "Mean", "Normalize", "ConcurrentModule", "GramMatrix", "DropBlock2D",
    "LabelSmoothing", "EncodingDrop", "UpsampleConv2d", "Inspiration", "EncodingCosine", "ConvBnAct",
    "NLLMultiLabelSmooth", "MODULE_WRAPPERS", "is_module_wrapper",
    "batchnormtrain", "NonMaxSuppression", "set_sbn_eps_mode", "pe_tuple", "tuple_outputs",
    "batchnorm", "functional", "helpers", "layers", "loss", "metrics", "outputs", "scheduler", "wrappers",
]


def _names(module: Any, names: str) -> Dict[str, Any]:
    """``{name: module.name}`` for the space-separated ``names``."""
    return {name: getattr(module, name) for name in names.split()}


_SCHEDULERS = _names(scheduler, "LR_Scheduler LR_Scheduler_Head")
_METRICS = _names(metrics, "batch_pix_accuracy batch_intersection_union pixel_accuracy intersection_and_union")
_FILES = {"mkdir": mkdir, "check_sha1": check_sha1, "download": download}
_PALETTE = {"get_mask_pallete": get_mask_pallete}
#: The heads PE exported from ``encoding.nn``; they live with their models (``encoding.models`` exports them).
_HEADS = _names(models, "FCNHead PyramidPooling PSPHead ASPP DeepLabV3Head EncModule EncHead PAM CAM DANetHead "
                        "FPNHead JPU")

#: Module -> {old name: the object it names there}: every old name, once per module users import it from.
#: :func:`install` binds them; ``docs/migration.md`` documents them.
ALIASES: Dict[str, Dict[str, Any]] = {
    "encoding.utils": {**_SCHEDULERS, **_METRICS, **_PALETTE, **_FILES,
                       # not a PE name: kept where scripts imported it (the dataset registry's palette names)
                       "PALETTE_NAMES": utils.palette.PALETTE_NAMES},
    "encoding.utils.lr_scheduler": _SCHEDULERS,
    "encoding.utils.metrics": _METRICS,
    "encoding.utils.palette": _PALETTE,
    "encoding.utils.files": _FILES,
    "encoding.datasets": {"get_dataset": datasets.get_segmentation_dataset},
    "encoding.nn": {
        "DistSyncBatchNorm": nn.SyncBatchNorm,
        "SegmentationLosses": SegmentationLosses, "OhemCrossEntropy": OhemCrossEntropy,
        **_names(batchnorm, " ".join(batchnorm.__all__)),
        **_names(layers, " ".join(layers.__all__)),
        **_HEADS,
        "set_sbn_eps_mode": set_sbn_eps_mode,  # vacancy's switch (sync_batchnorm.set_sbn_eps_mode)
    },
    "encoding.functions": {"batchnormtrain": batchnormtrain, "NonMaxSuppression": NonMaxSuppression},
    "encoding.parallel": {"is_module_wrapper": is_module_wrapper},
    # what moved from the dataset modules to encoding.datasets.prepare (the dataset modules only load data)
    "encoding.datasets.ade20k": {"prepare_ade20k": prepare.prepare_ade20k, "RESOURCES": prepare.ADE20K_RESOURCES},
    "encoding.datasets.pascal_voc": {"prepare_pascal": prepare.prepare_pascal, "RESOURCES": prepare.VOC_RESOURCES},
    "encoding.datasets.pcontext": {"prepare_pcontext": prepare.prepare_pcontext,
                                   "RESOURCES": prepare.CONTEXT_RESOURCES, "decode_rle": prepare.decode_rle,
                                   "convert_context_annotations": prepare.convert_context_annotations},
    "encoding.datasets.cityscapes": {"prepare_citys": prepare.prepare_citys, "PACKAGES": prepare.CITYS_PACKAGES,
                                     "INSTRUCTIONS": prepare.CITYS_INSTRUCTIONS},
    "encoding.datasets.coco": {"prepare_coco": prepare.prepare_coco, "RESOURCES": prepare.COCO_RESOURCES},
    "encoding.datasets.shapes": {"prepare_shapes": prepare.prepare_shapes},
}


def _hides_core(current: Any, obj: Any) -> bool:
    """Whether binding ``obj`` over ``current`` would hide a different object. A class may be replaced by its
    subclass of the same name (the loss classes of ``encoding.nn``: the core class plus PE's argument layouts)."""
    if current is obj:
        return False
    return not (isinstance(current, type) and isinstance(obj, type) and issubclass(obj, current)
                and obj.__name__ == current.__name__)


def install() -> None:
    """Bind every name of :data:`ALIASES` in its module (idempotent; nothing is bound when a check fails).

    Raises:
        RuntimeError: an alias would hide a different object its module already has (see :func:`_hides_core`).
    """
    modules = {module_name: importlib.import_module(module_name) for module_name in ALIASES}
    for module_name, names in ALIASES.items():
        for name, obj in names.items():
            current = vars(modules[module_name]).get(name, obj)
            if _hides_core(current, obj):
                raise RuntimeError(f"encoding.legacy: {module_name}.{name} is already {current!r}; the alias "
                                   f"{obj!r} would hide it")
    for module_name, names in ALIASES.items():
        for name, obj in names.items():
            setattr(modules[module_name], name, obj)
