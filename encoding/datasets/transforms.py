"""Joint image/mask transforms for segmentation, built on :mod:`torchvision.transforms.v2`.

Inside the pipeline an image is a ``uint8`` :class:`tv_tensors.Image` (``3 x H x W``) and a mask a ``uint8``
:class:`tv_tensors.Mask` (``H x W``) whose ignore value is :data:`LABEL_IGNORE` (255); v2 dispatches on those types,
so every geometric op resizes masks with nearest-neighbour and photometric ops leave masks alone. Only at the very end
(:func:`to_index_mask`) do masks become ``int64`` with :data:`IGNORE_INDEX` (-1).

Training recipe (PyTorch-Encoding's): random horizontal flip, long side resized to a random integer in
``[0.5 * base_size, 2.0 * base_size]``, random crop of at most ``crop_size`` (:class:`RandomCropUpTo`), optional
photometric jitter, the image transform (normalisation by default), then bottom/right padding up to ``crop_size``
(:class:`PadTo`) with 0 for the normalised image and ignore for the mask. Cropping before normalising and padding after
is equivalent to padding first (pad at the bottom/right, then crop) and gives exactly 0 in the padded image area.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IGNORE_INDEX",
    "RandomLongSideResize",
    "RandomCropUpTo",
    "PadTo",
    "image_transform",
    "denormalize",
    "train_joint_transform",
    "val_joint_transform",
    "to_index_mask",
]

IMAGENET_MEAN: Tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: Tuple[float, float, float] = (0.229, 0.224, 0.225)
#: The ignore label: the value of unscored pixels in every mask a dataset returns (PyTorch-Encoding convention);
#: losses and metrics default to it. Exported as ``encoding.datasets.IGNORE_INDEX``.
IGNORE_INDEX = -1
#: Internal: how the uint8 transform pipeline stores ignored pixels (mapped to :data:`IGNORE_INDEX` at the end).
LABEL_IGNORE = 255


class RandomLongSideResize(v2.Transform):
    """Resize so that the long side becomes a random integer in ``[min_size, max_size]``, keeping the aspect ratio.

    Args:
        min_size: smallest long side (inclusive).
        max_size: largest long side (inclusive).
        antialias: antialias images when downscaling (masks always use nearest-neighbour).
    """

    def __init__(self, min_size: int, max_size: int, antialias: bool = True) -> None:
        super().__init__()
        if not 0 < min_size <= max_size:
            raise ValueError(f"need 0 < min_size <= max_size, got {min_size}, {max_size}")
        self.min_size, self.max_size, self.antialias = int(min_size), int(max_size), antialias

    def make_params(self, flat_inputs: list) -> Dict[str, Any]:
        height, width = v2.query_size(flat_inputs)
        long_side = int(torch.randint(self.min_size, self.max_size + 1, ()).item())
        if height >= width:
            size = [long_side, max(1, int(width * long_side / height + 0.5))]
        else:
            size = [max(1, int(height * long_side / width + 0.5)), long_side]
        return {"size": size}

    def transform(self, inpt: Any, params: Dict[str, Any]) -> Any:
        return self._call_kernel(F.resize, inpt, size=params["size"], interpolation=v2.InterpolationMode.BILINEAR,
                                 antialias=self.antialias)


class RandomCropUpTo(v2.Transform):
    """Random crop of ``min(size, H) x min(size, W)``: never pads (see :class:`PadTo`).

    Args:
        size: crop side (square crops).
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = int(size)

    def make_params(self, flat_inputs: list) -> Dict[str, Any]:
        height, width = v2.query_size(flat_inputs)
        crop_h, crop_w = min(self.size, height), min(self.size, width)
        top = int(torch.randint(0, height - crop_h + 1, ()).item())
        left = int(torch.randint(0, width - crop_w + 1, ()).item())
        return {"top": top, "left": left, "height": crop_h, "width": crop_w}

    def transform(self, inpt: Any, params: Dict[str, Any]) -> Any:
        return self._call_kernel(F.crop, inpt, **params)


class PadTo(v2.Transform):
    """Pad at the bottom and right up to ``size x size`` (inputs already at least that large are unchanged).

    Args:
        size: target side.
        image_fill: value for image pixels (0 = the mean colour once normalised).
        mask_fill: value for mask pixels (the ignore label).
    """

    def __init__(self, size: int, image_fill: float = 0.0, mask_fill: int = LABEL_IGNORE) -> None:
        super().__init__()
        self.size, self.image_fill, self.mask_fill = int(size), image_fill, mask_fill

    def make_params(self, flat_inputs: list) -> Dict[str, Any]:
        height, width = v2.query_size(flat_inputs)
        return {"padding": [0, 0, max(0, self.size - width), max(0, self.size - height)]}

    def transform(self, inpt: Any, params: Dict[str, Any]) -> Any:
        if not any(params["padding"]):
            return inpt
        fill = self.mask_fill if isinstance(inpt, tv_tensors.Mask) else self.image_fill
        return self._call_kernel(F.pad, inpt, padding=params["padding"], fill=fill)


def image_transform(mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> v2.Compose:
    """The default image-only transform: ``uint8`` to ``float32`` in ``[0, 1]``, then per-channel normalisation."""
    return v2.Compose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])


def denormalize(image: Tensor) -> Tensor:
    """Undo :func:`image_transform`'s default normalisation: a ``3 x H x W`` image in ``[0, 1]``, on the CPU."""
    mean = torch.tensor(IMAGENET_MEAN, dtype=image.dtype).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=image.dtype).view(3, 1, 1)
    return (image.cpu() * std + mean).clamp(0, 1)


def train_joint_transform(base_size: int, crop_size: int, scale_range: Tuple[float, float] = (0.5, 2.0),
                          flip: bool = True, jitter: Optional[float] = None) -> v2.Compose:
    """Random geometric (and optional photometric) training transform for an ``(image, mask)`` pair.

    Args:
        base_size: reference long side; the long side is drawn from ``[scale_range[0] * base_size,
            scale_range[1] * base_size]``.
        crop_size: side of the random crop (smaller results are padded later by :class:`PadTo`).
        scale_range: relative range of the long side.
        flip: random horizontal flip with probability 0.5.
        jitter: strength of brightness/contrast/saturation jitter (e.g. 0.4), ``None`` or 0 for none.
    """
    steps: list = [v2.RandomHorizontalFlip(0.5)] if flip else []
    steps += [RandomLongSideResize(int(base_size * scale_range[0]), int(base_size * scale_range[1])),
              RandomCropUpTo(crop_size)]
    if jitter:
        steps.append(v2.ColorJitter(brightness=jitter, contrast=jitter, saturation=jitter))
    return v2.Compose(steps)


def val_joint_transform(crop_size: int) -> v2.Compose:
    """Validation transform: short side resized to ``crop_size`` (masks nearest), then a centre crop."""
    return v2.Compose([v2.Resize(crop_size, antialias=True), v2.CenterCrop(crop_size)])


def to_index_mask(mask: Tensor) -> Tensor:
    """``uint8`` mask with 255 = ignore -> plain ``int64`` tensor with -1 = ignore."""
    out = mask.as_subclass(Tensor).to(torch.int64)
    out[out == LABEL_IGNORE] = IGNORE_INDEX
    return out
