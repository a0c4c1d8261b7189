"""Segment images in Python: :func:`segment` (``encoding.segment``) and the inference module behind it and
``test.py`` / ``demo.py`` (:func:`inference_module`).

Three ways to turn an image of any size into logits at its size:

* ``mode="whole"``: one pass over the whole image (the model's output is resized to the input by the model);
* ``mode="slide"``: mmsegmentation's single-scale sliding window (:class:`~encoding.models.SlidingWindow`): windows of
  ``window`` pixels every ``stride`` pixels, logits averaged where they overlap;
* ``scales=(...)``: PyTorch-Encoding's multi-scale evaluation (:class:`~encoding.models.MultiEvalModule`): the image
  resized so that its long side is ``base_size * scale`` for each scale, each scale evaluated by ``crop_size``
  windows (``window`` when given), the logits averaged over scales.

``flip=True`` averages each pass with the horizontally flipped image's.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence, Union

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from ..datasets.base import BaseDataset
from ..datasets.transforms import IMAGENET_MEAN, IMAGENET_STD, image_transform
from ..models import MultiEvalModule, SlidingWindow
from ..utils.metrics import labels_of, main_output
from .loading import ModelInfo, model_info

__all__ = ["INFERENCE_MODES", "InferenceOptionError", "check_windows", "to_batch", "inference_module", "segment"]

#: The values of ``mode``: the whole image at once, or mmsegmentation's sliding window.
INFERENCE_MODES = ("whole", "slide")

ImageLike = Union[str, os.PathLike, Image.Image, np.ndarray, Tensor]


class InferenceOptionError(ValueError):
    """A window / stride that inference cannot use (one line naming the value; scripts exit with status 2)."""

    exit_status = 2


def check_windows(window: Optional[int], stride: Optional[int]) -> None:
    """Refuse a ``window`` / ``stride`` that is not a positive int (``0`` is no "default"), or a stride larger than
    the window (the pixels between two windows would be covered by none: NaN logits).

    Raises:
        InferenceOptionError: naming the value.
    """
    for name, value in (("window", window), ("stride", stride)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise InferenceOptionError(f"{name} must be a positive number of pixels, got {value!r}")
    if window is not None and stride is not None and stride > window:
        raise InferenceOptionError(f"stride {stride} is larger than the window {window}: the pixels between two "
                                   "windows would be covered by none; use a stride of at most the window")


def to_batch(image: ImageLike, mean: Sequence[float] = IMAGENET_MEAN,
             std: Sequence[float] = IMAGENET_STD) -> Tensor:
    """``image`` as a normalised ``float32 B x 3 x H x W`` batch.

    Args:
        image: a path (read by the datasets' reader: EXIF-upright, any mode converted to RGB), a PIL image, an
            ``H x W x 3`` ``uint8`` array, a ``uint8`` tensor ``3 x H x W`` / ``B x 3 x H x W`` (normalised here), or a
            float tensor ``3 x H x W`` / ``B x 3 x H x W`` taken as already normalised (as the datasets give them).
        mean, std: the normalisation of ``uint8`` inputs.

    Raises:
        DatasetError: an unreadable image file (the message names it).
        ValueError: any other shape or type (the message says which).
    """
    if isinstance(image, (str, os.PathLike)):
        image = BaseDataset._read_image(os.fspath(image))
    if isinstance(image, Image.Image):
        image = np.array(image.convert("RGB"))
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"segment: expected an H x W x 3 uint8 array, got {image.dtype} {image.shape}")
        image = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
    if not isinstance(image, Tensor):
        raise ValueError(f"segment: expected a path, PIL image, array or tensor, got {type(image).__name__}")
    image = image.as_subclass(Tensor)
    if image.dim() not in (3, 4) or image.shape[-3] != 3:
        raise ValueError(f"segment: expected a 3 x H x W or B x 3 x H x W tensor, got shape {tuple(image.shape)}")
    if image.numel() == 0:
        raise ValueError(f"segment: the image is empty (shape {tuple(image.shape)}): nothing to segment")
    if image.dtype == torch.uint8:
        image = image_transform(mean, std)(image)
    elif not image.is_floating_point():
        raise ValueError(f"segment: expected a uint8 or floating-point tensor, got {image.dtype}")
    return image if image.dim() == 4 else image.unsqueeze(0)


def inference_module(model: nn.Module, *, mode: str = "whole", window: Optional[int] = None,
                     stride: Optional[int] = None, scales: Optional[Sequence[float]] = None, flip: bool = False,
                     info: Optional[ModelInfo] = None) -> nn.Module:
    """``model`` inside the module that computes logits at the input's size as ``mode`` / ``scales`` / ``flip`` say
    (see the module's description); ``model`` itself for ``mode="whole"`` without scales or flip.

    Args:
        model: a segmentation model in eval mode.
        mode: ``"whole"`` or ``"slide"``.
        window, stride: the windows of ``"slide"`` (default: the training crop, and two thirds of the window), or
            of the multi-scale windows (default: the training crop and two thirds of it).
        scales: multi-scale evaluation, relative to the training ``base_size``.
        flip: average with the flipped image.
        info: the sizes and classes (default: ``model.info``, see :func:`~encoding.engine.loading.model_info`;
            needed for the default window and for ``scales``).

    Raises:
        ValueError: an unknown mode, or a window / scales without the sizes to use. InferenceOptionError: a window or
            stride that is not positive, or a stride larger than the window (see :func:`check_windows`).
    """
    check_windows(window, stride)
    if mode not in INFERENCE_MODES:
        raise ValueError(f"unknown inference mode {mode!r}; valid: {', '.join(INFERENCE_MODES)}")
    if mode == "whole" and (window is not None or stride is not None) and not scales:
        raise ValueError("window / stride are options of mode='slide' (or of scales=...), not of mode='whole'")
    if scales:
        info = info or model_info(model)
        window = window or info.crop_size
        check_windows(window, stride)
        return MultiEvalModule(model, info.out_channels, base_size=info.base_size, crop_size=window, scales=scales,
                               flip=flip, stride_rate=min((stride or window * 2 / 3) / window, 1.0),
                               mean=info.mean, std=info.std)
    if mode == "slide":
        window = window or (info or model_info(model)).crop_size
        check_windows(window, stride)
    elif not flip:
        return model
    return SlidingWindow(model, window, stride, flip)


@torch.inference_mode()
def segment(model: nn.Module, image: ImageLike, *, mode: str = "whole", window: Optional[int] = None,
            stride: Optional[int] = None, scales: Optional[Sequence[float]] = None, flip: bool = False,
            device: Optional[Union[str, torch.device]] = None) -> Tensor:
    """The class ids of ``image``, at its size.

    Args:
        model: a segmentation model in eval mode (from :func:`~encoding.engine.loading.load_model`, or any model
            whose output is ``{"out": logits}`` or logits at its input's size).
        image: a path, PIL image, ``H x W x 3`` ``uint8`` array or tensor (see :func:`to_batch`); any size.
        mode, window, stride, scales, flip: how (see :func:`inference_module`).
        device: where to run (default: the model's parameters' device).

    Returns:
        ``H x W`` ``int64`` class ids on the CPU (``B x H x W`` for a batch).

    Memory (on ``device``): the normalised image (``B x 3 x H x W`` float32) and the logits at its size (``B x nclass
    x H x W`` float32, accumulated in place by ``"slide"`` and ``scales``) plus, for ``"slide"``, an ``H x W`` count
    and one window's activations (``"whole"``: the model's activations on the whole image); the labels are ``int64``
    ``B x H x W``. A 2000 x 2000 image with 150 classes: 2.4 GB of logits, held once.

    Raises:
        ValueError: an image of the wrong type or shape, or empty (``0 x 0``); a bad mode, window or stride.

    Example:
        >>> model = encoding.load_model("runs/shapes/unet/default/model_best.pth")   # doctest: +SKIP
        >>> labels = encoding.segment(model, "photo.jpg", mode="slide", window=512, stride=341)  # doctest: +SKIP
    """
    info = getattr(model, "info", None)
    norm = (info.mean, info.std) if isinstance(info, ModelInfo) else (IMAGENET_MEAN, IMAGENET_STD)
    batch = to_batch(image, *norm)
    if device is None:
        device = next(model.parameters()).device
    module = inference_module(model, mode=mode, window=window, stride=stride, scales=scales, flip=flip,
                              info=info if isinstance(info, ModelInfo) else None)
    threshold = info.options.get("threshold", 0.5) if isinstance(info, ModelInfo) else 0.5
    labels = labels_of(main_output(module(batch.to(device))), threshold).cpu()
    return labels if isinstance(image, Tensor) and image.dim() == 4 else labels[0]
