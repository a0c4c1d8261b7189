"""Dilated backbones built from torchvision's model builders: the ResNet family and MobileNetV3.

``get_backbone(name, output_stride=8)`` builds torchvision's ResNet / ResNeXt / Wide-ResNet, drops its classifier and
turns the last stages' strides into dilations (output stride 8: ``layer3`` dilation 2 and ``layer4`` dilation 4,
the first 3x3 conv of each dilated stage keeping the previous dilation, as torchvision's
``replace_stride_with_dilation`` does for bottleneck blocks; the same rule also covers the basic blocks of
ResNet-18/34, which torchvision refuses to dilate). ``mobilenet_v3_large`` / ``mobilenet_v3_small`` are light
backbones for fast segmentation (:class:`MobileNetV3Backbone`): the same four stages at strides 4, 8, 16 and 32,
dilated the same way. ``vgg_tiny`` and ``vgg_tiny_s2`` (:class:`VGGTinyBackbone`) are this package's own: a few
plain 3x3 conv layers at strides 2 to 16 (about 0.2M parameters) for training from scratch on small images, such as
the embedded ``shapes`` data on a CPU (``vgg_tiny_s2``, the built-in recipe's, has its stem at stride 2).

Weights (loaded by :mod:`~encoding.models.weights`): ``pretrained=True`` loads torchvision's default ImageNet weights
through its weights API (from the torch hub cache, ``$TORCH_HOME/hub/checkpoints``, or downloaded there);
``pretrained="file.pth"`` loads a local state dict with ``torch.load(weights_only=True)``. ``pretrained=False`` never
touches the network.
"""
from __future__ import annotations

import functools
from typing import Dict, List, Tuple

import torch
import torchvision
from torch import Tensor, nn

from ..nn.blocks import NormLayer, conv_norm_act
from .mit import MIT_SETTINGS, get_mit
from .timm_backbones import RESNEST, TIMM_PREFIX, get_timm_backbone, is_timm_backbone
from .stages import DILATIONS, StagedBackbone, dilate_stage, stage_channels
from .weights import Pretrained, load_backbone_weights

__all__ = ["ResNetBackbone", "MobileNetV3Backbone", "VGGTinyBackbone", "VGG_TINY_STEM_STRIDES", "get_backbone",
           "backbone_list"]

#: This package's own plain backbones: name -> the stride of the stem conv (:class:`VGGTinyBackbone`).
#: ``vgg_tiny_s2`` (the built-in ``shapes`` recipe's) starts at stride 2: about 15% less CPU time per training step
#: than ``vgg_tiny``'s full-resolution stem, with the same parameters and the same feature strides.
VGG_TINY_STEM_STRIDES: Dict[str, int] = {"vgg_tiny": 1, "vgg_tiny_s2": 2}

#: The BatchNorm setting of torchvision's MobileNetV3 that its ImageNet weights compute with, applied to the BatchNorm
#: class a MobileNetV3 backbone is built with (:func:`_mobilenet_norm_layer`). Its training momentum (0.01) is not:
#: trained from scratch it leaves the evaluation statistics unusable in short runs (the norm layer's own is kept).
MOBILENET_V3_BN = {"eps": 0.001}

#: Backbone names built from torchvision (also the names of its builders and weights).
_TORCHVISION_BACKBONES: Tuple[str, ...] = (
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d", "wide_resnet50_2", "wide_resnet101_2",
    "mobilenet_v3_large", "mobilenet_v3_small",
)
#: Every backbone name: torchvision's, this package's own (no published weights), PE's ResNeSt (timm's) and
#: SegFormer's Mix Transformers (ours; layer norms, so ``norm_layer`` does not apply).
_BACKBONES: Tuple[str, ...] = (_TORCHVISION_BACKBONES + tuple(VGG_TINY_STEM_STRIDES) + tuple(RESNEST)
                                + tuple(MIT_SETTINGS))


def backbone_list() -> List[str]:
    """Names accepted by :func:`get_backbone` (besides any ``timm:<name>``)."""
    return list(_BACKBONES)


class ResNetBackbone(StagedBackbone):
    """The stem and four stages of a torchvision ResNet, returning every stage's output.

    Its state-dict keys are those of the torchvision ResNet without ``fc`` (``conv1``, ``bn1``, ``layer1``...), as
    in torchvision's segmentation models.

    Args:
        resnet: a torchvision ``ResNet`` (its ``avgpool`` and ``fc`` are not kept).
        output_stride: the stride of ``layer4`` relative to the input (8, 16 or 32); stages past it are dilated.

    Attributes:
        channels: output channels of ``(c1, c2, c3, c4)``.
        output_stride: as given.

    Shape:
        - Input: ``B x 3 x H x W``.
        - Output: list ``[c1, c2, c3, c4]`` at strides ``4, 8, min(16, os), os``.
    """

    def __init__(self, resnet: torchvision.models.ResNet, output_stride: int = 8) -> None:
        super().__init__()
        self._check_output_stride(output_stride)
        self.conv1, self.bn1, self.relu, self.maxpool = resnet.conv1, resnet.bn1, resnet.relu, resnet.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4
        self.output_stride = output_stride
        for stage, dilation in zip((self.layer3, self.layer4), DILATIONS[output_stride]):
            if dilation is not None:
                dilate_stage(stage, *dilation)
        self.channels = tuple(stage_channels(stage) for stage in self.stages())

    def stem(self, x: Tensor) -> Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def stages(self) -> Tuple[nn.Sequential, ...]:
        """``(layer1, layer2, layer3, layer4)``."""
        return self.layer1, self.layer2, self.layer3, self.layer4


class MobileNetV3Backbone(StagedBackbone):
    """The inverted-residual blocks of a torchvision MobileNetV3 cut into four stages, returning every stage's output.

    ``features`` is torchvision's own ``features`` module, so the state-dict keys are those of the torchvision model
    without ``classifier`` (``features.0.0.weight``...). The stages are cut where the stride doubles: ``c1`` (stride
    4, after the stem) ... ``c4`` (stride 32, ending with the last 1x1 conv: 960 channels for ``large``, 576 for
    ``small``). Stages past ``output_stride`` lose their stride and have every spatial conv dilated (2, then 4).
    :func:`get_backbone` builds its BatchNorm layers with torchvision's eps (0.001).

    Args:
        mobilenet: a torchvision ``MobileNetV3`` (its ``classifier`` is not kept).
        output_stride: the stride of ``c4`` relative to the input (8, 16 or 32).

    Attributes (``channels``, ``output_stride``) and shapes are those of :class:`ResNetBackbone`.
    """

    def __init__(self, mobilenet: nn.Module, output_stride: int = 16) -> None:
        super().__init__()
        self._check_output_stride(output_stride)
        self.features = mobilenet.features
        self.output_stride = output_stride
        self._bounds = _stride_boundaries(self.features)
        for stage, dilation in zip(self.stages()[2:], DILATIONS[output_stride]):
            if dilation is not None:
                _dilate_all(stage, dilation[1])
        self.channels = tuple(stage_channels(stage) for stage in self.stages())

    def stem(self, x: Tensor) -> Tensor:
        return self.features[0](x)

    def stages(self) -> Tuple[nn.Sequential, ...]:
        """The four stages (views of ``features``: slicing shares the blocks, the state dict does not change)."""
        return tuple(self.features[start:end] for start, end in self._bounds)


class VGGTinyBackbone(StagedBackbone):
    """A small plain CNN (3x3 conv → norm → ReLU layers, VGG-style) for training from scratch on small images.

    A stem conv, then four stages that each end (or, for ``c4``, begin) with a stride-2 conv:
    ``c1`` at stride 2 (``width`` channels), ``c2`` at 4 (``2 * width``), ``c3`` at 8 (``3 * width``) and ``c4``
    at 16 (``3 * width``, two convs). At ``output_stride=8``, ``c4`` keeps stride 8 and its convs are dilated 2 and 4,
    which gives the last layers a receptive field of the whole image on inputs of about 64 pixels. The finer strides
    than ResNet's (2 ... 16 instead of 4 ... 32) keep detail for a skip decoder such as
    :class:`~encoding.models.unet.UNetHead`.

    With ``stem_stride=1`` (``vgg_tiny``) the stem runs at full resolution and ``c1``'s conv has stride 2; with
    ``stem_stride=2`` (``vgg_tiny_s2``) the stem has the stride and ``c1``'s conv runs at stride 2: no layer at full
    resolution, about 15% less CPU time per training step of the ``shapes`` recipe. Their parameters have the same
    shapes, so they are two backbone names (recorded with the weights): weights trained on one are never built as
    the other.

    Args:
        width: channels of ``c1``.
        output_stride: 16 (plain) or 8 (dilated ``c4``).
        norm_layer: normalization layer class.
        stem_stride: 1 (full-resolution stem) or 2.

    Attributes (``channels``, ``output_stride``) are those of :class:`ResNetBackbone`.

    Shape:
        - Input: ``B x 3 x H x W``.
        - Output: list ``[c1, c2, c3, c4]`` at strides ``2, 4, 8, output_stride``.
    """

    def __init__(self, width: int = 24, output_stride: int = 16, norm_layer: NormLayer = nn.BatchNorm2d,
                 stem_stride: int = 1) -> None:
        super().__init__()
        if output_stride not in (8, 16):
            raise ValueError(f"output_stride of vgg_tiny must be 8 or 16, got {output_stride}")
        if stem_stride not in (1, 2):
            raise ValueError(f"stem_stride of vgg_tiny must be 1 or 2, got {stem_stride}")
        w1, w2, w3 = width, 2 * width, 3 * width

        def layer(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
            return conv_norm_act(cin, cout, 3, norm_layer, stride=stride)

        self.conv1 = layer(3, w1, stem_stride)
        self.layer1 = nn.Sequential(layer(w1, w1, 2 // stem_stride))  # c1 at stride 2: the stem's or this conv's
        self.layer2 = nn.Sequential(layer(w1, w2), layer(w2, w2, 2))
        self.layer3 = nn.Sequential(layer(w2, w3), layer(w3, w3, 2))
        self.layer4 = nn.Sequential(layer(w3, w3, 2), layer(w3, w3))
        if output_stride == 8:
            dilate_stage(self.layer4, 2, 4)
        self.output_stride = output_stride
        self.channels = (w1, w2, w3, w3)

    def stem(self, x: Tensor) -> Tensor:
        # channels_last: about 20% less CPU time per training step of the shapes recipe than NCHW (oneDNN's
        # convolutions take it natively; every later layer keeps the layout)
        return self.conv1(x.contiguous(memory_format=torch.channels_last))

    def stages(self) -> Tuple[nn.Sequential, ...]:
        """``(layer1, layer2, layer3, layer4)``."""
        return self.layer1, self.layer2, self.layer3, self.layer4


def _block_stride(block: nn.Module) -> int:
    return max(m.stride[0] for m in block.modules() if isinstance(m, nn.Conv2d))


def _stride_boundaries(features: nn.Sequential) -> List[Tuple[int, int]]:
    """``[(start, end)]`` of the four stages of ``features`` (block 0 is the stride-2 stem): a stage begins at every
    block that halves the resolution once the stride is 4."""
    stride, starts = _block_stride(features[0]), []
    for i in range(1, len(features)):
        step = _block_stride(features[i])
        stride *= step
        if not starts and stride == 4:
            starts.append(1)
        elif starts and step > 1:
            starts.append(i)
    if len(starts) != 4:
        raise ValueError(f"expected a stem and four stride-doubling stages, found {len(starts)} stages")
    return list(zip(starts, starts[1:] + [len(features)]))


def _dilate_all(stage: nn.Sequential, dilation: int) -> None:
    """Remove the stride of ``stage`` and dilate every spatial conv by ``dilation`` in place ("same" padding)."""
    for module in stage.modules():
        if isinstance(module, nn.Conv2d) and module.kernel_size[0] > 1:
            module.stride = (1, 1)
            module.dilation = (dilation, dilation)
            module.padding = tuple((k - 1) // 2 * dilation for k in module.kernel_size)


def get_backbone(name: str = "resnet50", output_stride: int = 8, norm_layer: NormLayer = nn.BatchNorm2d,
                 pretrained: Pretrained = False) -> nn.Module:
    """Build a (dilated) ResNet-family, MobileNetV3, ``vgg_tiny``, ResNeSt, MiT or ``timm:<name>`` backbone.

    Args:
        name: one of :func:`backbone_list` (``resnet18`` ... ``resnet152``, ``resnext50_32x4d``,
            ``resnext101_32x8d``, ``resnext101_64x4d``, ``wide_resnet50_2``, ``wide_resnet101_2``,
            ``mobilenet_v3_large``, ``mobilenet_v3_small``, ``vgg_tiny``, ``vgg_tiny_s2``; with timm:
            ``resnest50``, ``resnest101``, ``resnest200``, ``resnest269``; SegFormer's ``mit_b0`` ... ``mit_b5``,
            output stride 32 and their own layer norms), or ``timm:<name>`` for any timm model
            (:mod:`~encoding.models.timm_backbones`).
        output_stride: 8 (default, dilated ``layer3`` and ``layer4``), 16 (dilated ``layer4``) or 32 (plain);
            ``vgg_tiny``: 8 or 16 (see :class:`VGGTinyBackbone`); ``timm:<name>``: where timm supports it.
        norm_layer: normalization layer class, e.g. ``nn.BatchNorm2d`` or ``encoding.nn.SyncBatchNorm``
            (MobileNetV3 builds a BatchNorm class with torchvision's eps 0.001).
        pretrained: ``False`` (random init, no network access), ``True`` (torchvision's default ImageNet weights;
            timm's for the timm backbones) or the path of a local state-dict file (the torchvision or timm model's
            keys; ``fc.*`` / ``classifier.*`` are ignored).

    Returns:
        A :class:`ResNetBackbone`, :class:`MobileNetV3Backbone`, :class:`VGGTinyBackbone`,
        :class:`~encoding.models.timm_backbones.ResNeStBackbone` or
        :class:`~encoding.models.timm_backbones.TimmBackbone`.

    Raises:
        ValueError: unknown name (the message lists the valid ones) or output stride, weights that do not fit, or
            ``pretrained=True`` for ``vgg_tiny`` (it has no published weights).
        RuntimeError: ``pretrained=True`` while offline and torchvision's weights are not cached
            (``ConnectionError`` for the timm backbones).

    Example:
        >>> backbone = get_backbone("resnet18", output_stride=8)
        >>> [f.shape[1] for f in backbone(torch.randn(1, 3, 64, 64))]
        [64, 128, 256, 512]
    """
    if is_timm_backbone(name):
        return get_timm_backbone(name, output_stride, norm_layer, pretrained)
    if name in MIT_SETTINGS:
        return get_mit(name, output_stride, pretrained)
    if name not in _BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; valid backbones: {', '.join(_BACKBONES)}, or "
                         f"{TIMM_PREFIX}<name> for any timm model")
    if pretrained is True and name not in _TORCHVISION_BACKBONES:
        raise ValueError(f"{name} has no published weights; pretrained=True is available for "
                         f"{', '.join(_TORCHVISION_BACKBONES)}")
    backbone = _build_backbone(name, output_stride, norm_layer)
    load_backbone_weights(backbone, name, pretrained)
    return backbone


def _build_backbone(name: str, output_stride: int, norm_layer: NormLayer) -> StagedBackbone:
    if name in VGG_TINY_STEM_STRIDES:
        return VGGTinyBackbone(output_stride=output_stride, norm_layer=norm_layer,
                               stem_stride=VGG_TINY_STEM_STRIDES[name])
    if name.startswith("mobilenet"):
        network = getattr(torchvision.models, name)(weights=None, norm_layer=_mobilenet_norm_layer(norm_layer))
        return MobileNetV3Backbone(network, output_stride)
    return ResNetBackbone(getattr(torchvision.models, name)(weights=None, norm_layer=norm_layer), output_stride)


def _mobilenet_norm_layer(norm_layer: NormLayer) -> NormLayer:
    """``norm_layer`` with torchvision's MobileNetV3 eps (:data:`MOBILENET_V3_BN`: 0.001)
    when it is a BatchNorm class (``nn.BatchNorm2d``, :class:`~encoding.nn.SyncBatchNorm`, a subclass); any other
    norm layer (a ``functools.partial``, ``GroupNorm``...) as given.

    Torchvision builds MobileNetV3 with eps 0.001; with BatchNorm's default (1e-5) its ImageNet weights compute
    something else.
    """
    if isinstance(norm_layer, type) and issubclass(norm_layer, nn.modules.batchnorm._BatchNorm):
        return functools.partial(norm_layer, **MOBILENET_V3_BN)
    return norm_layer
