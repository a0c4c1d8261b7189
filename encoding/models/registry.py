"""The registry of segmentation architectures and of the named presets built from them (a leaf: it imports nothing
of ``encoding`` but the registry helper :mod:`encoding.registry`, itself a leaf).

Each ``encoding/models/<arch>.py`` registers its head factory with :func:`register_architecture`; registering also
adds the PyTorch-Encoding presets ``<arch>_<backbone>_<dataset>`` (see :data:`model_list`); the public builder
``encoding.models.get_<arch>`` is one line of ``encoding/models/__init__.py``
(:func:`encoding.models.factory.builder`). The registry only describes architectures;
:mod:`~encoding.models.factory` builds them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple, Type

from torch import nn

from ..registry import Registry

if TYPE_CHECKING:  # for the annotations only: the registry imports no module of encoding.models
    from .base import SegmentationModel

__all__ = ["Architecture", "ARCHITECTURES", "register_architecture", "get_architecture", "PRESETS", "model_list",
           "PRESET_DATASETS", "PRESET_BACKBONES", "RESNEST_PRESET_BACKBONES", "RESNEST_PRESET_DATASETS",
           "PE_PUBLISHED"]

#: Head factory ``head(features: FeatureInfo, nclass, *, norm_layer, **options) -> nn.Module``.
HeadFactory = Callable[..., nn.Module]


@dataclass(frozen=True)
class Architecture:
    """How to assemble one kind of segmentation model.

    Attributes:
        model: the :class:`SegmentationModel` subclass (decides which stages feed the head).
        head: factory ``head(features, nclass, *, norm_layer, **options) -> nn.Module`` where ``features`` is the
            backbone's :class:`~encoding.models.base.FeatureInfo` (stage channels and output stride).
        output_stride: the backbone's default output stride (8 = dilated, 32 = plain for pyramid heads).
        se_loss: whether the head has an SE-loss branch (its factory then takes ``se_loss``).
        title: how documentation names the model (e.g. ``"PSPNet"``; the docstring of its ``get_<name>``).
    """

    model: Type[SegmentationModel]
    head: HeadFactory
    output_stride: int = 8
    se_loss: bool = False
    title: str = ""


#: Registry of the segmentation models: name -> :class:`Architecture` (filled by :func:`register_architecture`).
ARCHITECTURES: Registry[Architecture] = Registry("segmentation model")

#: Dataset names used in preset names -> registry names of :data:`encoding.datasets.datasets`.
PRESET_DATASETS: Dict[str, str] = {"ade": "ade20k", "pcontext": "pcontext", "voc": "pascal_voc",
                                   "aug": "pascal_aug", "citys": "citys", "coco": "coco"}
PRESET_BACKBONES = ("resnet50", "resnet101")
#: PyTorch-Encoding's ResNeSt backbones (built with timm) and the datasets of its ResNeSt model zoo: every dilated
#: architecture (default output stride 8) has the presets ``<model>_<resnest>_<dataset>`` of these.
RESNEST_PRESET_BACKBONES = ("resnest50", "resnest101", "resnest200", "resnest269")
RESNEST_PRESET_DATASETS = ("ade", "pcontext")

#: PyTorch-Encoding's published results of its ResNeSt model zoo, ``preset -> (pixAcc, mIoU)`` in % (PE's multi-scale
#: evaluation; PE's numbers and weights, not measured here; PE's mIoU counts absent classes as 0).
PE_PUBLISHED: Dict[str, Tuple[float, float]] = {
    "fcn_resnest50_ade": (80.18, 42.94), "deeplab_resnest50_ade": (81.17, 45.12),
    "deeplab_resnest101_ade": (82.07, 46.91), "deeplab_resnest200_ade": (82.45, 48.36),
    "deeplab_resnest269_ade": (82.62, 47.60), "fcn_resnest50_pcontext": (79.19, 51.98),
    "deeplab_resnest50_pcontext": (80.41, 53.19), "deeplab_resnest101_pcontext": (81.91, 56.49),
    "deeplab_resnest200_pcontext": (82.50, 58.37), "deeplab_resnest269_pcontext": (83.06, 58.92),
}

#: ``<model>_<backbone>_<dataset>`` -> builder arguments (PyTorch-Encoding's recipe: aux head on, SE loss on for
#: EncNet).
PRESETS: Dict[str, dict] = {}

#: Names accepted by :func:`encoding.models.get_model`, e.g. ``"encnet_resnet50_pcontext"`` (kept sorted).
model_list: List[str] = []


def register_architecture(name: str, model: Type[SegmentationModel], *, output_stride: int = 8,
                          se_loss: bool = False, title: Optional[str] = None) -> Callable[[HeadFactory], HeadFactory]:
    """Decorator registering a head factory as the architecture ``name`` (its presets and its ``get_<name>``).

    Args:
        name: the name :func:`~encoding.models.get_segmentation_model` accepts.
        model: the model class the head goes into.
        output_stride: default backbone output stride.
        se_loss: the head has an SE-loss branch.
        title: how documentation names the model (default: the model class's name).

    Raises:
        ValueError: ``name`` is already registered.
    """
    def decorator(head: HeadFactory) -> HeadFactory:
        ARCHITECTURES.register(name, Architecture(model, head, output_stride, se_loss, title or model.__name__))
        for backbone in PRESET_BACKBONES:
            for short, dataset in PRESET_DATASETS.items():
                PRESETS[f"{name}_{backbone}_{short}"] = dict(name=name, backbone=backbone, dataset=dataset,
                                                             aux=True, se_loss=se_loss)
        for backbone in RESNEST_PRESET_BACKBONES if output_stride == 8 else ():
            for short in RESNEST_PRESET_DATASETS:
                PRESETS[f"{name}_{backbone}_{short}"] = dict(name=name, backbone=backbone,
                                                             dataset=PRESET_DATASETS[short], aux=True, se_loss=se_loss)
        model_list[:] = sorted(PRESETS)
        return head
    return decorator


def get_architecture(name: str) -> Architecture:
    """The registered :class:`Architecture` ``name``.

    Raises:
        ValueError: unknown name (the message lists the valid ones).
    """
    return ARCHITECTURES.get(name)
