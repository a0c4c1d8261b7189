"""encoding.datasets: segmentation datasets with PyTorch-Encoding names, joint transforms and prepare helpers.

Registry names (``datasets[name]`` is the class; each class carries its metadata: ``NUM_CLASS``, ``CLASSES``,
``PALETTE``, ``IGNORE_COLOR``; every returned mask uses :data:`IGNORE_INDEX` (-1) for ignored pixels):

==============  ==============================  =========
name            class                           NUM_CLASS
==============  ==============================  =========
``ade20k``      :class:`ADE20KSegmentation`     150
``pascal_voc``  :class:`VOCSegmentation`        21
``pascal_aug``  :class:`VOCAugSegmentation`     21
``pcontext``    :class:`ContextSegmentation`    59
``citys``       :class:`CitySegmentation`       19
``coco``        :class:`COCOSegmentation`       21
``shapes``      :class:`ShapesSegmentation`     7 (embedded, generated locally)
``folder``      :class:`FolderSegmentation`     a user's folder (``classes.yaml`` or the scan of its masks)
==============  ==============================  =========

Example:
    >>> from encoding.datasets import get_segmentation_dataset, pad_collate
    >>> train = get_segmentation_dataset("shapes", split="train")            # doctest: +SKIP
    >>> val = get_segmentation_dataset("shapes", split="val", mode="testval")  # doctest: +SKIP
"""
from typing import Any, Optional, Type

from .base import BaseDataset, DatasetError, MODES, default_root
from .layout import warn_shared_images
from .transforms import IGNORE_INDEX, IMAGENET_MEAN, IMAGENET_STD
from .collate import list_collate, pad_collate, pad_stack
from .ade20k import ADE20KSegmentation
from .pascal_voc import VOCSegmentation
from .pascal_aug import VOCAugSegmentation
from .pcontext import ContextSegmentation
from .cityscapes import CitySegmentation
from .coco import COCOSegmentation
from .shapes import ShapesSegmentation
from .folder import FolderSegmentation
from .prepare import prepare_ade20k, prepare_citys, prepare_coco, prepare_pascal, prepare_pcontext, prepare_shapes
from ..registry import Registry
from ..utils.palette import register_palettes

__all__ = [
    "datasets",
    "get_segmentation_dataset",
    "BaseDataset",
    "DatasetError",
    "MODES",
    "warn_shared_images",
    "IGNORE_INDEX",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "default_root",
    "pad_collate",
    "list_collate",
    "pad_stack",
    "ADE20KSegmentation",
    "VOCSegmentation",
    "VOCAugSegmentation",
    "ContextSegmentation",
    "CitySegmentation",
    "COCOSegmentation",
    "ShapesSegmentation",
    "FolderSegmentation",
    "prepare_ade20k",
    "prepare_pascal",
    "prepare_pcontext",
    "prepare_citys",
    "prepare_coco",
    "prepare_shapes",
]

#: Dataset registry: PyTorch-Encoding name -> dataset class (``datasets.register(name, cls)`` adds one).
datasets: Registry[Type[BaseDataset]] = Registry("dataset", {
    "ade20k": ADE20KSegmentation,
    "pascal_voc": VOCSegmentation,
    "pascal_aug": VOCAugSegmentation,
    "pcontext": ContextSegmentation,
    "citys": CitySegmentation,
    "coco": COCOSegmentation,
    "shapes": ShapesSegmentation,
    "folder": FolderSegmentation,
})
register_palettes(datasets)  # colorize(mask, "ade20k") and the other palette names read the classes' colours


def get_segmentation_dataset(name: str, root: Optional[str] = None, split: str = "train", mode: Optional[str] = None,
                             transform: Any = None, **kwargs: Any) -> BaseDataset:
    """Build a registered dataset by name.

    Args:
        name: registry name (case-insensitive), see :data:`datasets`.
        root: data root (default ``$ENCODING_DATA`` or ``~/.encoding/data``).
        split: sample list, e.g. ``train`` / ``val``.
        mode: ``train``, ``val``, ``testval`` or ``test`` (default derived from ``split``).
        transform: image-only transform (default: ImageNet normalisation).
        **kwargs: forwarded to the class (``base_size``, ``crop_size``, ``skip_bad``, ...).

    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    cls = datasets.get(name.lower(), None)
    if cls is None:
        raise ValueError(datasets.unknown(name))
    return cls(root=root, split=split, mode=mode, transform=transform, **kwargs)

