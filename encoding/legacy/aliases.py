"""Core objects under their old names: each declared once here, in the module where PyTorch-Encoding users import it.

The PE objects that :mod:`encoding.legacy` defines are declared beside their definitions; this module holds the old
names that are plain aliases of a core object. A function or a class warns (``EncodingDeprecationWarning``) naming
the new spelling when used; a constant (``RESOURCES``, ...) is bound as it is. A module under an old path
(``encoding.nn.losses``, the engine's modules that moved to ``encoding.inference``: :data:`MOVED_MODULES`) holds its
new module's names declared the same way.
"""
from __future__ import annotations

from typing import Any, Optional

from .. import config, datasets, engine, inference, memory, models, nn, utils
from ..datasets import get_segmentation_dataset, prepare
from ..datasets.prepare.download import download
from .declare import OWN, PEERS, EncodingDeprecationWarning, alias, old_module, old_name

__all__ = ["HEADS", "MOVED_MODULES", "ENGINE_EXPORTS"]


# a subclass, not a bare alias: PE's 4th positional parameter is process_group (the core's keyword-only one)
class DistSyncBatchNorm(nn.SyncBatchNorm):
    """PyTorch-Encoding's ``DistSyncBatchNorm(num_features, eps, momentum, process_group)``: the core
    :class:`~encoding.nn.SyncBatchNorm` with PE's positional order (its 4th parameter is ``process_group``; the core's
    other parameters are keyword-only here)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 process_group: Optional[object] = None, **kwargs: Any) -> None:
        super().__init__(num_features, eps=eps, momentum=momentum, process_group=process_group, **kwargs)


old_name("encoding.nn", "encoding.nn.syncbn", new="encoding.nn.SyncBatchNorm")(DistSyncBatchNorm)

alias(get_segmentation_dataset, "get_dataset", "encoding.datasets", new="encoding.datasets.get_segmentation_dataset")
alias(download, "download", "encoding.utils", "encoding.utils.files", new="encoding.datasets.prepare.download.download")
alias(utils.save_checkpoint, "save_checkpoint", "encoding.utils.files", new="encoding.utils.save_checkpoint")
# PE's encoding/utils/misc.py: AverageMeter (now in encoding.utils.logger) and the warning of every old name
old_module("encoding.utils.misc", "encoding.utils.logger", why=PEERS)
old_name("encoding.utils", "encoding.utils.misc", star=("encoding.utils.misc",))(EncodingDeprecationWarning)
# not a PE name: kept where scripts imported it (the dataset registry's palette names)
alias(utils.palette.PALETTE_NAMES, "PALETTE_NAMES", "encoding.utils")
# not a PE path: this package's own old module of Dice / Focal / Lovasz and LOSSES (one owner of the losses now)
old_module("encoding.nn.losses", "encoding.nn.loss")
# not PE names: the recomputation policies under their names before recompute= (one tuple now)
alias(nn.RECOMPUTE_POLICIES, "CHECKPOINT_POLICIES", "encoding.nn", "encoding.nn.recompute")
alias(nn.RECOMPUTE_POLICIES, "RECOMPUTE", "encoding.config", "encoding.config.groups")

# not PE paths: this package's own, from before inference and sharing left the engine (encoding.inference) and the
# engine's run assembly was named for what it does (encoding.engine.assemble; encoding.config owns the recipes)
#: old module path -> the module that holds its names now
MOVED_MODULES = {
    "encoding.engine.loading": "encoding.inference.loading",
    "encoding.engine.predict": "encoding.inference.predict",
    "encoding.engine.hub": "encoding.inference.hub",
    "encoding.engine.demo": "encoding.inference.demo",
    "encoding.engine.inference": "encoding.inference.evaluation",
    "encoding.engine.evaluation_plots": "encoding.inference.evaluation_plots",
    "encoding.engine.error_maps": "encoding.inference.error_maps",
    "encoding.engine.config": "encoding.engine.assemble",
    "encoding.engine.recipes": "encoding.config.recipes",
}
for _old, _new in MOVED_MODULES.items():
    old_module(_old, _new)
alias(config.DIST_TIMEOUT_S, "DIST_TIMEOUT_S", "encoding.engine.config")  # its home before encoding.config
# twin names made one (constants: bound as they are): the run's config.yaml and a model folder's config.json had one
# name; the memory tool's strategies had the training registry's; the folder datasets' error had a second name
alias(engine.assemble.RUN_CONFIG_NAME, "CONFIG_NAME", "encoding.engine.assemble", "encoding.engine.config")
alias(inference.hub.MODEL_CONFIG_NAME, "CONFIG_NAME", "encoding.inference.hub", "encoding.engine.hub")
alias(memory.program.MEMORY_STRATEGIES, "STRATEGIES", "encoding.memory.program")
alias(datasets.DatasetError, "DataError", "encoding.datasets.folder_meta")
#: what ``encoding.engine`` exported before :mod:`encoding.inference` had it
ENGINE_EXPORTS = ("load_model", "ModelInfo", "model_info", "inference_module", "segment", "save_pretrained",
                  "load_pretrained", "push_to_hub")
for _name in ENGINE_EXPORTS:
    alias(getattr(inference, _name), _name, "encoding.engine", new=f"encoding.inference.{_name}", why=OWN)

#: The heads PE exported from ``encoding.nn``; they live with their models (``encoding.models`` exports them).
HEADS = ("FCNHead", "PyramidPooling", "PSPHead", "ASPP", "DeepLabV3Head", "EncModule", "EncHead", "PAM", "CAM",
         "DANetHead", "FPNHead", "JPU")
for _head in HEADS:
    alias(getattr(models, _head), _head, "encoding.nn", new=f"encoding.models.{_head}")

# what moved from the dataset modules to encoding.datasets.prepare (the dataset modules only load data)
_MOVED = {
    "encoding.datasets.ade20k": {"prepare_ade20k": prepare.prepare_ade20k, "RESOURCES": prepare.ADE20K_RESOURCES},
    "encoding.datasets.pascal_voc": {"prepare_pascal": prepare.prepare_pascal, "RESOURCES": prepare.VOC_RESOURCES},
    "encoding.datasets.pcontext": {"prepare_pcontext": prepare.prepare_pcontext, "RESOURCES": prepare.CONTEXT_RESOURCES,
                                   "decode_rle": prepare.decode_rle,
                                   "convert_context_annotations": prepare.convert_context_annotations},
    "encoding.datasets.cityscapes": {"prepare_citys": prepare.prepare_citys, "PACKAGES": prepare.CITYS_PACKAGES,
                                     "INSTRUCTIONS": prepare.CITYS_INSTRUCTIONS},
    "encoding.datasets.coco": {"prepare_coco": prepare.prepare_coco, "RESOURCES": prepare.COCO_RESOURCES},
    "encoding.datasets.shapes": {"prepare_shapes": prepare.prepare_shapes},
}
for _module, _names in _MOVED.items():
    for _name, _obj in _names.items():
        alias(_obj, _name, _module, new=None if _name.isupper() else f"encoding.datasets.prepare.{_obj.__name__}")
