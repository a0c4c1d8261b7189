"""Pretrained weights: where they come from and how they are loaded into backbones and whole models.

Two sources, one loader: torchvision's published weights, fetched through its weights API into the torch hub cache
(``$TORCH_HOME/hub/checkpoints``) — ImageNet weights for the backbones, COCO-with-VOC-labels weights for the models of
:data:`TORCHVISION_WEIGHTS` —, or a local state-dict / checkpoint file read with ``weights_only=True``. Both go
through the checked loader :func:`encoding.utils.load_model_state`. Nothing here touches the network unless asked
(``pretrained=True`` / ``"torchvision"``).
"""
from __future__ import annotations

import os
from typing import Dict, Union

import torch
import torchvision
from torch import Tensor, nn

from ..errors import EncodingError
from ..utils.checkpoint import load_model_state, read_state_dict
from .hf_segformer import hf_download_hint, read_segformer_weights

__all__ = ["Pretrained", "TORCHVISION_WEIGHTS", "WeightsUnavailable", "fetch_torchvision_weights",
           "load_backbone_weights", "load_pretrained"]

#: What ``pretrained`` / ``pretrained_backbone`` accept: ``False``, ``True`` (torchvision's weights) or a file path.
Pretrained = Union[bool, str, os.PathLike]

#: (model, backbone) -> torchvision segmentation weights enum (COCO subset with the 21 Pascal VOC classes).
TORCHVISION_WEIGHTS: Dict[tuple, str] = {
    ("fcn", "resnet50"): "FCN_ResNet50_Weights",
    ("fcn", "resnet101"): "FCN_ResNet101_Weights",
    ("deeplab", "resnet50"): "DeepLabV3_ResNet50_Weights",
    ("deeplab", "resnet101"): "DeepLabV3_ResNet101_Weights",
}


def fetch_torchvision_weights(weights: torchvision.models.WeightsEnum) -> Dict[str, Tensor]:
    """The state dict of torchvision ``weights``, from the torch hub cache or downloaded into it.

    Raises:
        WeightsUnavailable: the file is not cached and cannot be downloaded (offline); the message names the URL and the
            cache path where the file can be placed by hand.
    """
    filename = os.path.basename(weights.url)
    cached = os.path.join(torch.hub.get_dir(), "checkpoints", filename)
    try:
        return weights.get_state_dict(progress=False, check_hash=True, map_location="cpu", weights_only=True)
    except OSError as err:  # URLError, HTTPError, timeouts, DNS failures
        raise WeightsUnavailable(
            f"could not download torchvision weights {weights} from {weights.url} ({err}). When offline, put the "
            f"file at {cached} (or set TORCH_HOME), or give a local file instead (a backbone's: --pretrained-backbone "
            "FILE / pretrained_backbone='FILE'; a preset's: encoding.load_model(name, weights='FILE'))."
        ) from err


class WeightsUnavailable(RuntimeError, EncodingError):
    """Published weights that are not cached and cannot be downloaded (the message says where to put them)."""


def load_backbone_weights(backbone: nn.Module, name: str, pretrained: Pretrained) -> None:
    """Load ``pretrained`` into the backbone ``name`` (torchvision's classifier keys ``fc.*`` / ``classifier.*`` are
    ignored).

    Args:
        backbone: the built backbone.
        name: its torchvision builder name (for ``pretrained=True``: torchvision's default ImageNet weights).
        pretrained: ``False``/``None`` (nothing), ``True`` or the path of a local state-dict file.

    Raises:
        ValueError: weights that do not fit, or an unsupported ``pretrained`` value.
        RuntimeError: ``pretrained=True`` while offline and the weights are not cached.
    """
    if pretrained is True:
        weights = torchvision.models.get_model_weights(name).DEFAULT
        state, source = fetch_torchvision_weights(weights), str(weights)
    elif isinstance(pretrained, (str, os.PathLike)):
        state, source = read_state_dict(pretrained), repr(os.fspath(pretrained))
    elif pretrained is False or pretrained is None:
        return
    else:
        raise ValueError(f"pretrained must be True, False or a file path, got {pretrained!r}")
    head = ("fc.", "classifier.")
    load_model_state(backbone, {k: v for k, v in state.items() if not k.startswith(head)}, source=source)


def load_pretrained(model: nn.Module, name: str, backbone: str, nclass: int, pretrained: Pretrained) -> None:
    """Load whole-model weights into the segmentation model ``name`` with ``backbone``.

    Args:
        model: the built model (a :class:`~encoding.models.base.SegmentationModel`).
        name: its architecture name.
        backbone: its backbone name.
        nclass: its number of classes.
        pretrained: ``True`` or ``"torchvision"`` (torchvision's weights, see :data:`TORCHVISION_WEIGHTS`), or the
            path of a state-dict / checkpoint file.

    Raises:
        ValueError: no published weights for ``name``/``backbone``, a class count that does not match them, an
            unsupported ``pretrained`` value, or weights that do not fit.
    """
    key = (name, backbone)
    if pretrained is True and name == "segformer" and backbone.startswith("mit_"):
        raise ValueError(hf_download_hint(backbone, whole_model=True))
    if pretrained is True:
        if key not in TORCHVISION_WEIGHTS:
            raise ValueError(
                f"no published weights for {name} with {backbone}; pretrained=True is available for "
                f"{', '.join(f'{m}/{b}' for m, b in TORCHVISION_WEIGHTS)} (torchvision's weights). Use "
                "pretrained='path/to/model.pth' for your own checkpoint, or pretrained_backbone=True for an "
                "ImageNet backbone.")
        pretrained = "torchvision"
    if pretrained == "torchvision":
        if key not in TORCHVISION_WEIGHTS:
            raise ValueError(f"pretrained='torchvision' is available for "
                             f"{', '.join(f'{m}/{b}' for m, b in TORCHVISION_WEIGHTS)}, not {name}/{backbone}")
        weights = getattr(torchvision.models.segmentation, TORCHVISION_WEIGHTS[key]).DEFAULT
        classes = len(weights.meta["categories"])
        if nclass != classes:
            raise ValueError(f"torchvision's {weights} predict {classes} classes (Pascal VOC), the model has "
                             f"{nclass}; build it with dataset='pascal_voc' (or nclass={classes})")
        state, source = fetch_torchvision_weights(weights), str(weights)
        if model.aux_classifier is None:
            state = {k: v for k, v in state.items() if not k.startswith("aux_classifier.")}
    elif isinstance(pretrained, (str, os.PathLike)):
        read = read_segformer_weights if name == "segformer" else read_state_dict
        state, source = read(pretrained), repr(os.fspath(pretrained))
    else:
        raise ValueError(f"pretrained must be False, True, 'torchvision' or a file path, got {pretrained!r}")
    load_model_state(model, state, source=source)
