"""Model registry and builders: ``get_segmentation_model``, the ``get_<model>`` variants and named presets.

Every builder follows one path: a public variant (``get_fcn`` ... or a preset name for :func:`get_model`) →
:func:`get_segmentation_model` → the private assembler ``_assemble``, which looks the architecture up in
:data:`ARCHITECTURES` and builds backbone, neck and heads and hands them to the model class.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Type, Union

import torchvision
from torch import nn

from ..nn.customize import JPU, FCNHead, NormLayer
from .backbone import Pretrained, fetch_torchvision_weights, get_backbone, load_state_dict_file, load_weights
from .base import SegmentationModel
from .danet import DANet, danet_head
from .deeplab import DeepLabV3, deeplab_head
from .encnet import EncNet, encnet_head
from .fcn import FCN, fcn_head
from .fpn import FCFPN, UperNet, fcfpn_head, upernet_head
from .psp import PSP, psp_head

__all__ = ["Architecture", "ARCHITECTURES", "get_segmentation_model", "get_model", "model_list",
           "get_fcn", "get_psp", "get_deeplab", "get_encnet", "get_danet", "get_upernet", "get_fcfpn"]


@dataclass(frozen=True)
class Architecture:
    """How to assemble one kind of segmentation model.

    Attributes:
        model: the :class:`SegmentationModel` subclass (decides which stages feed the head).
        head: factory ``head(channels, nclass, *, norm_layer, output_stride, **options) -> nn.Module``.
        output_stride: the backbone's default output stride (8 = dilated, 32 = plain for pyramid heads).
        se_loss: whether the head has an SE-loss branch (its factory then takes ``se_loss``).
    """

    model: Type[SegmentationModel]
    head: Callable[..., nn.Module]
    output_stride: int = 8
    se_loss: bool = False


#: Registry of the segmentation models: name -> :class:`Architecture`.
ARCHITECTURES: Dict[str, Architecture] = {
    "fcn": Architecture(FCN, fcn_head),
    "psp": Architecture(PSP, psp_head),
    "deeplab": Architecture(DeepLabV3, deeplab_head),
    "encnet": Architecture(EncNet, encnet_head, se_loss=True),
    "danet": Architecture(DANet, danet_head),
    "upernet": Architecture(UperNet, upernet_head, output_stride=32),
    "fcfpn": Architecture(FCFPN, fcfpn_head, output_stride=32),
}

#: (model, backbone) -> torchvision segmentation weights enum (COCO subset with the 21 Pascal VOC classes).
_TORCHVISION_WEIGHTS: Dict[tuple, str] = {
    ("fcn", "resnet50"): "FCN_ResNet50_Weights",
    ("fcn", "resnet101"): "FCN_ResNet101_Weights",
    ("deeplab", "resnet50"): "DeepLabV3_ResNet50_Weights",
    ("deeplab", "resnet101"): "DeepLabV3_ResNet101_Weights",
}

#: Dataset names used in preset names -> registry names of :data:`encoding.datasets.datasets`.
_PRESET_DATASETS: Dict[str, str] = {"ade": "ade20k", "pcontext": "pcontext", "voc": "pascal_voc",
                                    "aug": "pascal_aug", "citys": "citys", "coco": "coco"}
_PRESET_BACKBONES = ("resnet50", "resnet101")


def _architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown segmentation model {name!r}; valid models: {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def _num_classes(dataset: str) -> int:
    from ..datasets import datasets  # lazy: the dataset modules are not needed to build a model

    if dataset not in datasets:
        raise ValueError(f"unknown dataset {dataset!r}; valid datasets: {', '.join(datasets)} "
                         "(or pass nclass=... for a custom dataset)")
    return datasets[dataset].NUM_CLASS


def _assemble(arch: Architecture, nclass: int, backbone: str, aux: bool, norm_layer: NormLayer,
              output_stride: Optional[int], jpu: bool, pretrained_backbone: Pretrained,
              head_options: dict) -> SegmentationModel:
    if jpu and output_stride not in (None, 32):
        raise ValueError(f"jpu=True replaces dilation and needs output_stride=32, got {output_stride}")
    output_stride = 32 if jpu else (output_stride or arch.output_stride)
    body = get_backbone(backbone, output_stride, norm_layer, pretrained_backbone)
    channels = body.channels
    neck = None
    if jpu:
        neck = JPU(channels[1:], norm_layer=norm_layer)
        channels = (*channels[:3], neck.out_channels)
        output_stride = 8
    head = arch.head(channels, nclass, norm_layer=norm_layer, output_stride=output_stride, **head_options)
    aux_head = FCNHead(channels[arch.model.aux_input], nclass, norm_layer) if aux else None
    return arch.model(body, head, aux_head, neck)


def _load_pretrained(model: SegmentationModel, name: str, backbone: str, nclass: int,
                     pretrained: Union[bool, str, os.PathLike]) -> None:
    key = (name, backbone)
    if pretrained is True:
        if key not in _TORCHVISION_WEIGHTS:
            raise ValueError(
                f"no published weights for {name} with {backbone}; pretrained=True is available for "
                f"{', '.join(f'{m}/{b}' for m, b in _TORCHVISION_WEIGHTS)} (torchvision's weights). Use "
                "pretrained='path/to/model.pth' for your own checkpoint, or pretrained_backbone=True for an "
                "ImageNet backbone.")
        pretrained = "torchvision"
    if pretrained == "torchvision":
        if key not in _TORCHVISION_WEIGHTS:
            raise ValueError(f"pretrained='torchvision' is available for "
                             f"{', '.join(f'{m}/{b}' for m, b in _TORCHVISION_WEIGHTS)}, not {name}/{backbone}")
        weights = getattr(torchvision.models.segmentation, _TORCHVISION_WEIGHTS[key]).DEFAULT
        classes = len(weights.meta["categories"])
        if nclass != classes:
            raise ValueError(f"torchvision's {weights} predict {classes} classes (Pascal VOC), the model has "
                             f"{nclass}; build it with dataset='pascal_voc' (or nclass={classes})")
        state, source = fetch_torchvision_weights(weights), str(weights)
        if model.aux_classifier is None:
            state = {k: v for k, v in state.items() if not k.startswith("aux_classifier.")}
    elif isinstance(pretrained, (str, os.PathLike)):
        state, source = load_state_dict_file(pretrained), repr(os.fspath(pretrained))
    else:
        raise ValueError(f"pretrained must be False, True, 'torchvision' or a file path, got {pretrained!r}")
    load_weights(model, state, source)


def get_segmentation_model(name: str, dataset: str = "pascal_voc", backbone: str = "resnet50", aux: bool = False,
                           se_loss: bool = False, pretrained: Union[bool, str, os.PathLike] = False, *,
                           nclass: Optional[int] = None, norm_layer: NormLayer = nn.BatchNorm2d,
                           output_stride: Optional[int] = None, jpu: bool = False,
                           pretrained_backbone: Pretrained = False, **head_options) -> SegmentationModel:
    """Build a segmentation model by name.

    Args:
        name: one of :data:`ARCHITECTURES`: ``fcn``, ``psp``, ``deeplab``, ``encnet``, ``danet``, ``upernet``,
            ``fcfpn``.
        dataset: name in :data:`encoding.datasets.datasets`; gives the number of classes.
        backbone: see :func:`~encoding.models.backbone.backbone_list`.
        aux: add the auxiliary :class:`~encoding.nn.FCNHead` on ``c3`` (output ``"aux"``).
        se_loss: add the SE-loss branch (output ``"se"``); EncNet only.
        pretrained: ``False``; ``"torchvision"`` (or ``True``) for torchvision's published weights of
            ``fcn``/``deeplab`` with ``resnet50``/``resnet101`` (21 classes); or the path of a state-dict /
            checkpoint file of this model (loaded with ``weights_only=True``).
        nclass: number of classes, overriding the dataset's (for custom datasets).
        norm_layer: normalization layer for the whole model, e.g. ``encoding.nn.SyncBatchNorm``.
        output_stride: backbone output stride (default 8 for dilated models, 32 for ``upernet``/``fcfpn``).
        jpu: use a plain (stride-32) backbone with FastFCN's :class:`~encoding.nn.JPU` instead of dilation.
        pretrained_backbone: ``True`` for torchvision's ImageNet weights, or a local file (ignored parts of the
            model stay randomly initialised). Default ``False``: nothing is downloaded.
        **head_options: options of the head factory (e.g. ``lateral=True`` / ``ncodes`` for ``encnet``,
            ``atrous_rates`` for ``deeplab``, ``fpn_dim`` for ``upernet``/``fcfpn``).

    Returns:
        The model; ``model(x)`` returns ``{"out", ["aux"], ["se"]}`` at the input resolution.

    Raises:
        ValueError: unknown model, backbone or dataset (the message lists the valid ones), ``se_loss`` for a model
            without SE branch, or unavailable/mismatching weights.

    Example:
        >>> model = get_segmentation_model("encnet", dataset="pcontext", backbone="resnet50", aux=True,
        ...                                se_loss=True)
    """
    arch = _architecture(name)
    if nclass is None:
        nclass = _num_classes(dataset)
    if se_loss and not arch.se_loss:
        models = [n for n, a in ARCHITECTURES.items() if a.se_loss]
        raise ValueError(f"se_loss=True is not supported by {name!r}; models with an SE-loss branch: "
                         f"{', '.join(models)}")
    if arch.se_loss:
        head_options["se_loss"] = se_loss
    model = _assemble(arch, nclass, backbone, aux, norm_layer, output_stride, jpu, pretrained_backbone,
                      head_options)
    if pretrained is not False and pretrained is not None:
        _load_pretrained(model, name, backbone, nclass, pretrained)
    return model


def get_fcn(dataset: str = "pascal_voc", backbone: str = "resnet50", **kwargs) -> SegmentationModel:
    """FCN; see :func:`get_segmentation_model` for the arguments."""
    return get_segmentation_model("fcn", dataset, backbone, **kwargs)


def get_psp(dataset: str = "pascal_voc", backbone: str = "resnet50", **kwargs) -> SegmentationModel:
    """PSPNet; see :func:`get_segmentation_model` for the arguments."""
    return get_segmentation_model("psp", dataset, backbone, **kwargs)


def get_deeplab(dataset: str = "pascal_voc", backbone: str = "resnet50", **kwargs) -> SegmentationModel:
    """DeepLabV3; see :func:`get_segmentation_model` for the arguments."""
    return get_segmentation_model("deeplab", dataset, backbone, **kwargs)


def get_encnet(dataset: str = "pascal_voc", backbone: str = "resnet50", **kwargs) -> SegmentationModel:
    """EncNet; see :func:`get_segmentation_model` for the arguments (``se_loss``, ``lateral``, ``ncodes``)."""
    return get_segmentation_model("encnet", dataset, backbone, **kwargs)


def get_danet(dataset: str = "pascal_voc", backbone: str = "resnet50", **kwargs) -> SegmentationModel:
    """DANet; see :func:`get_segmentation_model` for the arguments."""
    return get_segmentation_model("danet", dataset, backbone, **kwargs)


def get_upernet(dataset: str = "pascal_voc", backbone: str = "resnet50", **kwargs) -> SegmentationModel:
    """UperNet; see :func:`get_segmentation_model` for the arguments."""
    return get_segmentation_model("upernet", dataset, backbone, **kwargs)


def get_fcfpn(dataset: str = "pascal_voc", backbone: str = "resnet50", **kwargs) -> SegmentationModel:
    """FCFPN; see :func:`get_segmentation_model` for the arguments."""
    return get_segmentation_model("fcfpn", dataset, backbone, **kwargs)


def _presets() -> Dict[str, dict]:
    """``<model>_<backbone>_<dataset>`` -> builder arguments (PyTorch-Encoding's training recipe: aux head on,
    SE loss on for EncNet)."""
    return {f"{model}_{backbone}_{short}": dict(name=model, backbone=backbone, dataset=dataset, aux=True,
                                                se_loss=arch.se_loss)
            for model, arch in ARCHITECTURES.items()
            for backbone in _PRESET_BACKBONES
            for short, dataset in _PRESET_DATASETS.items()}


_PRESETS = _presets()

#: Names accepted by :func:`get_model`, e.g. ``"encnet_resnet50_pcontext"``.
model_list: List[str] = sorted(_PRESETS)


def get_model(name: str, **kwargs) -> SegmentationModel:
    """Build a named preset ``<model>_<backbone>_<dataset>``, e.g. ``"encnet_resnet50_pcontext"``.

    Presets use the PyTorch-Encoding recipe: ``aux=True`` and, for EncNet, ``se_loss=True``. Dataset short names:
    ``ade`` (ade20k), ``pcontext``, ``voc`` (pascal_voc), ``aug`` (pascal_aug), ``citys``, ``coco``. Keyword
    arguments override the preset (see :func:`get_segmentation_model`); ``pretrained=True`` is available for
    ``fcn``/``deeplab`` with ``resnet50``/``resnet101`` on ``coco``/``voc``/``aug`` (torchvision's weights).

    Raises:
        ValueError: unknown name; the message lists the valid ones (also in :data:`model_list`).
    """
    key = name.lower()
    if key not in _PRESETS:
        raise ValueError(
            f"unknown model {name!r}; valid names are <model>_<backbone>_<dataset> with model in "
            f"{{{', '.join(ARCHITECTURES)}}}, backbone in {{{', '.join(_PRESET_BACKBONES)}}}, dataset in "
            f"{{{', '.join(_PRESET_DATASETS)}}} (see encoding.models.model_list)")
    options = dict(_PRESETS[key])
    options.update(kwargs)
    return get_segmentation_model(**options)
