"""Core objects under their old names: each declared once here, in the module where PyTorch-Encoding users import it.

The PE objects that :mod:`encoding.legacy` defines are declared beside their definitions; this module holds the old
names that are plain aliases of a core object. A function or a class warns (``FutureWarning``) naming the new
spelling when used; a constant (``RESOURCES``, ...) is bound as it is. A module under an old path
(``encoding.nn.losses``) holds its new module's names declared the same way.
"""
from __future__ import annotations

from .. import models, nn, utils
from ..datasets import get_segmentation_dataset, prepare
from ..datasets.prepare.download import download
from .declare import alias, old_module

__all__ = ["HEADS"]

alias(nn.SyncBatchNorm, "DistSyncBatchNorm", "encoding.nn", new="encoding.nn.SyncBatchNorm")
alias(get_segmentation_dataset, "get_dataset", "encoding.datasets", new="encoding.datasets.get_segmentation_dataset")
alias(download, "download", "encoding.utils", "encoding.utils.files", new="encoding.datasets.prepare.download.download")
# not a PE name: kept where scripts imported it (the dataset registry's palette names)
alias(utils.palette.PALETTE_NAMES, "PALETTE_NAMES", "encoding.utils")
# not a PE path: this package's own old module of Dice / Focal / Lovasz and LOSSES (one owner of the losses now)
old_module("encoding.nn.losses", "encoding.nn.loss")

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
