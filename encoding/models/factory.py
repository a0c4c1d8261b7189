"""Model builders: :func:`get_segmentation_model`, the named presets of :func:`get_model` and the ``get_<arch>``
builders.

Every builder follows one path: a public variant (``get_fcn`` ..., made by :func:`builder` for each registered
architecture, or a preset name for :func:`get_model`) → :func:`get_segmentation_model` → the private assembler
``_assemble``, which looks the architecture up in :data:`~encoding.models.registry.ARCHITECTURES`, builds backbone,
neck, head and auxiliary head (:class:`~encoding.models.heads.FCNHead`) and hands them to the model class; whole-model
weights come from :mod:`~encoding.models.weights`.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from typing import Any, Callable, Iterator, List, Optional, Union

from torch import nn

from ..errors import UsageError
from ..nn.blocks import NormLayer
from ..nn.recompute import checkpoint_segmentation_model
from ..utils.renamed import renamed_keyword
from .backbone import get_backbone
from ..names import is_model_spec
from .external import build_external_model
from .base import FeatureInfo, SegmentationModel
from .heads import FCNHead
from .jpu import JPU
from .registry import (ARCHITECTURES, PRESET_BACKBONES, PRESET_DATASETS, PRESETS, RESNEST_PRESET_BACKBONES,
                       RESNEST_PRESET_DATASETS, Architecture, get_architecture)
from .weights import TORCHVISION_WEIGHTS, Pretrained, load_pretrained

__all__ = ["get_segmentation_model", "get_model", "builder", "pretrained_model_list", "nclass_of", "check_nclass",
           "PE_UNUSED_OPTIONS", "PE_DILATED_STRIDES"]

#: PyTorch-Encoding's model keywords that have no effect here (accepted with one ``FutureWarning``): evaluation
#: sizes and normalisation (pass them to ``MultiEvalModule`` / the dataset), the weights directory, the backbone's
#: multi-grid options.
PE_UNUSED_OPTIONS = ("base_size", "crop_size", "mean", "std", "root", "multi_grid", "multi_dilation")
#: PyTorch-Encoding's ``dilated=`` -> the backbone output stride it means (its dilated ResNet: 8; plain: 32).
PE_DILATED_STRIDES = {True: 8, False: 32}


#: The dataset whose classes a model gets when neither ``dataset`` nor ``nclass`` is given (PyTorch-Encoding's).
DEFAULT_DATASET = "pascal_voc"
#: The datasets on which PyTorch-Encoding's ``get_encnet`` built EncNet's lateral variant (its rule: a name starting
#: with ``p``); here EncNet is lateral only when asked, on every path (:func:`_warn_pe_lateral`).
PE_LATERAL_DATASETS = ("pcontext", "pascal_voc", "pascal_aug")


def nclass_of(dataset: str) -> int:
    """The class count of the registered dataset ``dataset`` (any case, as PyTorch-Encoding's builders and
    :func:`~encoding.datasets.get_segmentation_dataset`: ``"PContext"`` is ``pcontext``).

    Raises:
        ValueError: an unknown dataset (the message lists the valid ones).
    """
    from ..datasets import datasets  # lazy: the dataset modules are not needed to build a model

    key = dataset if dataset in datasets or not isinstance(dataset, str) else dataset.lower()
    if key not in datasets:
        raise ValueError(f"unknown dataset {dataset!r}; valid datasets: {', '.join(datasets)} "
                         "(or pass nclass=... for a custom dataset)")
    return datasets[key].NUM_CLASS


def check_nclass(nclass: Any, subject: str = "nclass") -> int:
    """``nclass`` if it is a class count: a positive ``int`` (not a ``bool``). The one rule of every builder
    (:func:`get_segmentation_model`, :class:`~encoding.models.network.NetworkSpec`).

    Args:
        nclass: the value to check.
        subject: how the message names what was given (``"nclass"``, or the command-line flags of a network).

    Raises:
        UsageError: (a ``ValueError``) anything else, naming ``subject`` and the value.
    """
    if isinstance(nclass, bool) or not isinstance(nclass, int) or nclass < 1:
        raise UsageError(f"{subject}: the class count must be a positive int, got {nclass!r}")
    return nclass


def _resolve_nclass(nclass: Any, dataset: Optional[str]) -> int:
    """``nclass`` checked, or (``None``) the class count of ``dataset`` (``None``: :data:`DEFAULT_DATASET`)."""
    if nclass is None:
        return nclass_of(DEFAULT_DATASET if dataset is None else dataset)
    return check_nclass(nclass)


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
    features = FeatureInfo(tuple(channels), output_stride, backbone)
    head = arch.head(features, nclass, norm_layer=norm_layer, **head_options)
    aux_head = FCNHead(channels[arch.model.aux_input], nclass, norm_layer) if aux else None
    return arch.model(body, head, aux_head, neck)


def get_segmentation_model(name: str, dataset: Optional[str] = None, backbone: str = "resnet50", aux: bool = False,
                           se_loss: bool = False, pretrained: Union[bool, str, os.PathLike] = False, *,
                           nclass: Optional[int] = None, norm_layer: NormLayer = nn.BatchNorm2d,
                           output_stride: Optional[int] = None, jpu: bool = False,
                           pretrained_backbone: Pretrained = False, recompute: Union[bool, str] = False,
                           **head_options) -> SegmentationModel:
    """Build a segmentation model by name.

    Args:
        name: one of :data:`ARCHITECTURES`: ``fcn``, ``psp``, ``deeplab``, ``encnet``, ``danet``, ``upernet``,
            ``fcfpn``, ``deeplabv3plus``, ``unet``, ``segformer``.
        dataset: name in :data:`encoding.datasets.datasets` (any case); gives the number of classes (``None``, the
            default: ``pascal_voc``'s). EncNet named with one of PyTorch-Encoding's PASCAL datasets
            (:data:`PE_LATERAL_DATASETS`) without ``lateral`` warns: PyTorch-Encoding built the lateral variant
            there, this builds it only with ``lateral=True`` (the network train.py and ``load_model`` build).
        backbone: see :func:`~encoding.models.backbone.backbone_list` (torchvision's, ``vgg_tiny``, PE's ResNeSt
            ``resnest50`` ... ``resnest269``), ``timm:<name>`` for any timm model
            (:mod:`~encoding.models.timm_backbones`), or SegFormer's Mix Transformers ``mit_b0`` ... ``mit_b5``
            (:mod:`~encoding.models.mit`, output stride 32).
        aux: add the auxiliary :class:`~encoding.models.fcn.FCNHead` on ``c3`` (output ``"aux"``).
        se_loss: add the SE-loss branch (output ``"se"``); EncNet only.
        pretrained: ``False``; ``"torchvision"`` (or ``True``) for torchvision's published weights of
            ``fcn``/``deeplab`` with ``resnet50``/``resnet101`` (21 classes); or the path of a state-dict /
            checkpoint file of this model (loaded with ``weights_only=True``; for ``segformer`` also a Hugging Face
            SegFormer ``.bin`` / ``.safetensors`` file, converted).
        nclass: number of classes, overriding the dataset's (for custom datasets).
        norm_layer: normalization layer for the whole model, e.g. ``encoding.nn.SyncBatchNorm``.
        output_stride: backbone output stride (default 8 for dilated models, 16 for ``deeplabv3plus``, 32 for
            ``upernet``/``fcfpn``).
        jpu: use a plain (stride-32) backbone with FastFCN's :class:`~encoding.models.jpu.JPU` instead of dilation.
        pretrained_backbone: ``True`` for torchvision's ImageNet weights (timm's for the timm backbones), or a
            local file (ignored parts of the model stay randomly initialised). Default ``False``: nothing is
            downloaded.
        recompute: activation recomputation, trading compute for memory (see ``docs/checkpointing.md``):
            ``False`` / ``"none"`` (default), ``"backbone"`` (every residual block) or ``"all"`` (blocks, neck and
            heads); exact (BatchNorm statistics, SyncBatchNorm synchronisation and dropout masks are those of the
            forward). ``checkpoint=``, its old name, still works with a ``FutureWarning``.
        **head_options: options of the head factory (e.g. ``lateral=True`` / ``False`` / ``ncodes`` for ``encnet``,
            ``atrous_rates`` for ``deeplab``/``deeplabv3plus``, ``fpn_dim`` for ``upernet``/``fcfpn``).
            PyTorch-Encoding's keywords are accepted too: ``dilated`` (``True`` = ``output_stride=8``, ``False`` =
            ``output_stride=32``; given with an ``output_stride`` or ``jpu`` it contradicts, it raises),
            ``jpu="JPU"`` (= ``jpu=True``), and :data:`PE_UNUSED_OPTIONS` (``base_size``, ``crop_size``, ...),
            which have no effect and raise one ``FutureWarning``.

    Returns:
        The model; ``model(x)`` returns ``{"out", ["aux"], ["se"]}`` at the input resolution.

    Raises:
        ValueError: unknown model, backbone or dataset (the message lists the valid ones), an ``nclass`` that is
            not a positive int, ``se_loss`` for a model without SE branch, an output stride the backbone cannot
            take (naming ``dilated`` where it chose it), ``dilated`` contradicting ``output_stride`` / ``jpu``, or
            unavailable/mismatching weights.

    Example:
        >>> model = get_segmentation_model("encnet", dataset="pcontext", backbone="resnet50", aux=True,
        ...                                se_loss=True)
    """
    old = {key: head_options.pop(key) for key in ("checkpoint",) if key in head_options}
    recompute = renamed_keyword(old, "checkpoint", "recompute", recompute, "get_segmentation_model")
    recompute = False if recompute == "none" else recompute
    if is_model_spec(name):  # torchvision:NAME, transformers:PATH, module:factory: every option applied or refused
        return build_external_model(name, _resolve_nclass(nclass, dataset), aux=aux,
                                    pretrained_backbone=pretrained_backbone, norm_layer=norm_layer,
                                    recompute=recompute, se_loss=se_loss, output_stride=output_stride, jpu=jpu,
                                    pretrained=pretrained, **head_options)
    arch = get_architecture(name)
    output_stride, jpu, dilated = _pe_options(name, head_options, output_stride, jpu)
    nclass = _resolve_nclass(nclass, dataset)
    if se_loss and not arch.se_loss:
        models = [n for n, a in ARCHITECTURES.items() if a.se_loss]
        raise ValueError(f"se_loss=True is not supported by {name!r}; models with an SE-loss branch: "
                         f"{', '.join(models)}")
    _check_head_options(name, arch, head_options)
    if name == "encnet" and "lateral" not in head_options:
        _warn_pe_lateral(dataset)
    if arch.se_loss:
        head_options["se_loss"] = se_loss
    with _naming_dilated(dilated):
        model = _assemble(arch, nclass, backbone, aux, norm_layer, output_stride, jpu, pretrained_backbone,
                          head_options)
    if pretrained is not False and pretrained is not None:
        load_pretrained(model, name, backbone, nclass, pretrained)
    return checkpoint_segmentation_model(model, recompute)


def _pe_options(name: str, options: dict, output_stride: Optional[int], jpu: Any) -> tuple:
    """Take PyTorch-Encoding's keywords out of ``options``: ``dilated`` (:func:`_dilated_stride`), ``jpu="JPU"``
    -> ``jpu=True``; those without effect (:data:`PE_UNUSED_OPTIONS`) are dropped with one ``FutureWarning``.

    Returns:
        ``(output_stride, jpu, dilated)``; ``dilated`` is ``None`` when not given, else a ``bool``.

    Raises:
        UsageError: ``dilated`` contradicting ``output_stride`` or ``jpu``.
    """
    unused = sorted(key for key in PE_UNUSED_OPTIONS if key in options)
    for key in unused:
        del options[key]
    if unused:
        warnings.warn(f"get_segmentation_model({name!r}): PyTorch-Encoding option(s) {', '.join(unused)} have no "
                      "effect and will be refused in a future version (evaluation sizes go to MultiEvalModule; "
                      "see docs/migration.md)", FutureWarning, stacklevel=3)
    jpu = bool(jpu)
    dilated = bool(options.pop("dilated")) if "dilated" in options else None
    return _dilated_stride(dilated, output_stride, jpu), jpu, dilated


def _dilated_stride(dilated: Optional[bool], output_stride: Optional[int], jpu: bool) -> Optional[int]:
    """The output stride of PyTorch-Encoding's ``dilated`` (:data:`PE_DILATED_STRIDES`: ``True`` -> 8,
    ``False`` -> 32) given with ``output_stride`` and ``jpu``; ``output_stride`` itself without ``dilated``.

    Raises:
        UsageError: ``dilated`` contradicting ``output_stride``, or ``dilated=True`` with ``jpu`` (a plain
            stride-32 backbone), naming both.
    """
    if dilated is None:
        return output_stride
    stride = PE_DILATED_STRIDES[dilated]
    if jpu and dilated:
        raise UsageError("dilated=True conflicts with jpu=True: JPU replaces dilation on a plain stride-32 backbone "
                         "(pass one of them, or dilated=False with jpu)")
    if output_stride is not None and output_stride != stride:
        raise UsageError(f"dilated={dilated} conflicts with output_stride={output_stride}: dilated={dilated} is "
                         f"output_stride={stride} (pass one of them)")
    return stride


@contextlib.contextmanager
def _naming_dilated(dilated: Optional[bool]) -> Iterator[None]:
    """Let a refusal of the output stride (a ``ValueError`` mentioning it) that ``dilated`` chose name ``dilated``."""
    try:
        yield
    except ValueError as err:
        if dilated is None or "stride" not in str(err):
            raise
        raise UsageError(f"{err} (dilated={dilated} is output_stride={PE_DILATED_STRIDES[dilated]})") from err


def _check_head_options(name: str, arch: Architecture, head_options: dict) -> None:
    """Raise ``ValueError`` naming the options ``arch``'s head factory does not take (and those it takes)."""
    params = inspect.signature(arch.head).parameters
    valid = [p for p, v in params.items() if v.kind == v.KEYWORD_ONLY and p not in ("norm_layer", "se_loss")]
    unknown = sorted(set(head_options) - set(valid))
    if unknown:
        raise ValueError(f"model {name!r} has no head option {', '.join(unknown)}; its head options: "
                         f"{', '.join(valid) or 'none'}")


def _warn_pe_lateral(dataset: Optional[str]) -> None:
    """Say, where PyTorch-Encoding built another EncNet, which one this is (one network per description)."""
    if isinstance(dataset, str) and dataset.lower() in PE_LATERAL_DATASETS:
        warnings.warn(f"EncNet on {dataset}: PyTorch-Encoding's get_encnet built the lateral variant here; this "
                      "builds lateral=False, as train.py and encoding.load_model do. Pass lateral=True for "
                      "PyTorch-Encoding's network (and its published weights), lateral=False to silence this",
                      UserWarning, stacklevel=3)


def builder(name: str) -> Callable[..., SegmentationModel]:
    """The ``get_<name>(dataset, backbone, **kwargs)`` builder of the registered architecture ``name``
    (``get_fcn``, ...; :mod:`encoding.models` makes one for every registered architecture).

    Args:
        name: the architecture's registry name.

    Raises:
        ValueError: ``name`` is not registered.
    """
    title = get_architecture(name).title

    def build(dataset: str = "pascal_voc", backbone: str = "resnet50", **kwargs: Any) -> SegmentationModel:
        return get_segmentation_model(name, dataset, backbone, **kwargs)

    build.__name__ = build.__qualname__ = f"get_{name}"
    build.__doc__ = f"{title}; see :func:`get_segmentation_model` for the arguments."
    return build


def get_model(name: str, **kwargs) -> SegmentationModel:
    """Build a named preset ``<model>_<backbone>_<dataset>``, e.g. ``"encnet_resnet50_pcontext"``.

    Presets use the PyTorch-Encoding recipe: ``aux=True`` and, for EncNet, ``se_loss=True``. Dataset short names:
    ``ade`` (ade20k), ``pcontext``, ``voc`` (pascal_voc), ``aug`` (pascal_aug), ``citys``, ``coco``; the dilated
    models also have PE's ResNeSt presets (``deeplab_resnest101_ade``, ``encnet_resnest50_pcontext``...: backbones
    :data:`~encoding.models.registry.RESNEST_PRESET_BACKBONES` on ``ade`` / ``pcontext``). Keyword
    arguments override the preset (see :func:`get_segmentation_model`); ``pretrained=True`` is available for the
    presets of :func:`pretrained_model_list` (torchvision's weights of ``fcn``/``deeplab`` with
    ``resnet50``/``resnet101`` on ``coco``/``voc``/``aug``).

    Raises:
        ValueError: unknown name (the message lists the valid ones, also in :data:`model_list`), or
            ``pretrained=True`` for a preset without published weights (the message lists those with weights).
    """
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(
            f"unknown model {name!r}; valid names are <model>_<backbone>_<dataset> with model in "
            f"{{{', '.join(ARCHITECTURES)}}}, backbone in {{{', '.join(PRESET_BACKBONES)}}}, dataset in "
            f"{{{', '.join(PRESET_DATASETS)}}}, or backbone in {{{', '.join(RESNEST_PRESET_BACKBONES)}}} with dataset "
            f"in {{{', '.join(RESNEST_PRESET_DATASETS)}}} for the dilated models (see encoding.models.model_list)")
    pretrained = kwargs.get("pretrained", False)
    if (pretrained is True or pretrained == "torchvision") and key not in pretrained_model_list():
        raise ValueError(f"no published weights for the preset {name!r}; presets with published weights: "
                         f"{', '.join(pretrained_model_list())} (or pass pretrained='path/to/model.pth')")
    options = dict(PRESETS[key])
    options.update(kwargs)
    return get_segmentation_model(**options)


#: Preset dataset short names whose classes are those of the published weights (the 21 Pascal VOC classes).
_WEIGHTS_DATASETS = ("aug", "coco", "voc")


def pretrained_model_list() -> List[str]:
    """The presets of :data:`~encoding.models.model_list` with published weights, i.e. those that
    ``get_model(name, pretrained=True)`` (and ``--model-zoo NAME``) can load: torchvision's COCO-with-VOC-classes
    weights of ``fcn`` / ``deeplab`` with ``resnet50`` / ``resnet101``, on the 21-class datasets (sorted)."""
    return sorted(name for name, preset in PRESETS.items()
                  if (preset["name"], preset["backbone"]) in TORCHVISION_WEIGHTS
                  and name.rsplit("_", 1)[1] in _WEIGHTS_DATASETS)
