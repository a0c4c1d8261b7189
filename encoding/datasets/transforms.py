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

The pipelines are :class:`LeanCompose` s: a :class:`v2.Compose` that, for a ``(Image, Mask)`` pair or a single image
whose steps are all ones it knows (this module's and v2's flip / resize / crop / centre crop / colour jitter / dtype /
normalise), calls each step's torchvision kernels on plain tensors, skipping v2's per-transform machinery (pytree
flattening, kernel dispatch, tv_tensor wrapping). The kernels, their arguments and the random draws (order included)
are v2's, so the results are bitwise those of :class:`v2.Compose`; anything else goes through :class:`v2.Compose`.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

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
    "LeanCompose",
    "image_transform",
    "user_transform",
    "denormalize",
    "train_joint_transform",
    "val_joint_transform",
    "transform_pair",
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

    #: Image interpolation (v2's mask kernel turns it into nearest-neighbour for masks).
    INTERPOLATION = v2.InterpolationMode.BILINEAR

    def __init__(self, min_size: int, max_size: int, antialias: bool = True) -> None:
        super().__init__()
        if not 0 < min_size <= max_size:
            raise ValueError(f"need 0 < min_size <= max_size, got {min_size}, {max_size}")
        self.min_size, self.max_size, self.antialias = int(min_size), int(max_size), antialias

    def make_params(self, flat_inputs: list) -> Dict[str, Any]:
        return {"size": self.draw_size(*v2.query_size(flat_inputs))}

    def draw_size(self, height: int, width: int) -> List[int]:
        """The random output ``[height, width]`` for an input of ``height x width`` (one ``torch.randint``)."""
        long_side = int(torch.randint(self.min_size, self.max_size + 1, ()).item())
        if height >= width:
            return [long_side, max(1, int(width * long_side / height + 0.5))]
        return [max(1, int(height * long_side / width + 0.5)), long_side]

    def transform(self, inpt: Any, params: Dict[str, Any]) -> Any:
        return self._call_kernel(F.resize, inpt, size=params["size"], interpolation=self.INTERPOLATION,
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
        return self.draw_box(*v2.query_size(flat_inputs))

    def draw_box(self, height: int, width: int) -> Dict[str, int]:
        """The random crop box (``top``, ``left``, ``height``, ``width``) of an input of ``height x width`` (two
        ``torch.randint``: top, then left)."""
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
        return {"padding": self.padding(*v2.query_size(flat_inputs))}

    def padding(self, height: int, width: int) -> List[int]:
        """``[left, top, right, bottom]`` padding of an input of ``height x width``."""
        return [0, 0, max(0, self.size - width), max(0, self.size - height)]

    def transform(self, inpt: Any, params: Dict[str, Any]) -> Any:
        if not any(params["padding"]):
            return inpt
        fill = self.mask_fill if isinstance(inpt, tv_tensors.Mask) else self.image_fill
        return self._call_kernel(F.pad, inpt, padding=params["padding"], fill=fill)


# -------------------------------------------------------------------------------------------------- the lean path
#: One step on plain tensors, ``(step, image, mask or None) -> (image, mask or None)``: the kernels v2 dispatches to,
#: with v2's arguments and random draws, in v2's order.
_LeanStep = Callable[[Any, Tensor, Optional[Tensor]], Tuple[Tensor, Optional[Tensor]]]


def _mask_or_none(kernel: Callable, mask: Optional[Tensor], *args: Any, **kwargs: Any) -> Optional[Tensor]:
    return None if mask is None else kernel(mask, *args, **kwargs)


def _flip(step: v2.RandomHorizontalFlip, image: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    if torch.rand(1) >= step.p:  # v2's _RandomApplyTransform draw
        return image, mask
    return F.horizontal_flip_image(image), _mask_or_none(F.horizontal_flip_mask, mask)


def _long_side(step: RandomLongSideResize, image: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    size = step.draw_size(*image.shape[-2:])
    return (F.resize_image(image, size, interpolation=step.INTERPOLATION, antialias=step.antialias),
            _mask_or_none(F.resize_mask, mask, size, interpolation=step.INTERPOLATION))


def _resize(step: v2.Resize, image: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    return (F.resize_image(image, step.size, interpolation=step.interpolation, max_size=step.max_size,
                           antialias=step.antialias),
            _mask_or_none(F.resize_mask, mask, step.size, interpolation=step.interpolation, max_size=step.max_size))


def _crop_up_to(step: RandomCropUpTo, image: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    box = step.draw_box(*image.shape[-2:])
    return F.crop_image(image, **box), _mask_or_none(F.crop_mask, mask, **box)


def _center_crop(step: v2.CenterCrop, image: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    return F.center_crop_image(image, step.size), _mask_or_none(F.center_crop_mask, mask, step.size)


def _pad_to(step: PadTo, image: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    padding = step.padding(*image.shape[-2:])
    if not any(padding):
        return image, mask
    return (F.pad_image(image, padding, fill=step.image_fill),
            _mask_or_none(F.pad_mask, mask, padding, fill=step.mask_fill))


def _jitter(step: v2.ColorJitter, image: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    # v2's own draws and kernels on the plain image (the image kernels); masks pass photometric ops through
    return step.transform(image, step.make_params([image])), mask


def _to_dtype(step: v2.ToDtype, image: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    return F.to_dtype_image(image, step.dtype, scale=step.scale), mask  # a plain dtype converts images only


def _normalize(step: v2.Normalize, image: Tensor, mask: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    return F.normalize_image(image, step.mean, step.std, inplace=step.inplace), mask


_LEAN: Dict[type, _LeanStep] = {
    v2.RandomHorizontalFlip: _flip, RandomLongSideResize: _long_side, v2.Resize: _resize,
    RandomCropUpTo: _crop_up_to, v2.CenterCrop: _center_crop, PadTo: _pad_to, v2.ColorJitter: _jitter,
    v2.ToDtype: _to_dtype, v2.Normalize: _normalize,
}


#: Steps that leave the size alone and the mask untouched: the only ones an image-only stage may hold on the pair path.
_PHOTOMETRIC = (v2.ColorJitter, v2.ToDtype, v2.Normalize)


def _lean_steps(transforms: Sequence[Callable], into: List[Tuple[_LeanStep, Any]], image_only: bool = False) -> bool:
    """Append the lean form of each of ``transforms`` (nested composes flattened) to ``into``; ``False`` when one has
    none (an unknown or subclassed step, a hooked module, a per-type ``ToDtype``; with ``image_only``, a step that is
    not photometric)."""
    for step in transforms:
        kind = type(step)
        composed = kind in (v2.Compose, LeanCompose)
        if not (composed or kind in _LEAN) or step._forward_hooks or step._forward_pre_hooks:
            return False
        if composed:
            if not _lean_steps(step.transforms, into, image_only):
                return False
        elif (image_only and kind not in _PHOTOMETRIC) or (kind is v2.ToDtype and not isinstance(step.dtype,
                                                                                                 torch.dtype)):
            return False
        else:
            into.append((_LEAN[kind], step))
    return True


def _lean_inputs(inputs: tuple) -> bool:
    """Whether ``inputs`` are one image (a ``... x C x H x W`` plain tensor or :class:`tv_tensors.Image`) or an
    ``(image, tv_tensors.Mask)`` pair of the same ``H x W``: the samples whose v2 semantics the lean path has."""
    if not 1 <= len(inputs) <= 2 or type(inputs[0]) not in (Tensor, tv_tensors.Image) or inputs[0].ndim < 3:
        return False
    if len(inputs) == 1:
        return True
    mask = inputs[1]
    return type(mask) is tv_tensors.Mask and mask.ndim == 2 and mask.shape == inputs[0].shape[-2:]


def _run_lean(steps: List[Tuple[_LeanStep, Any]], inputs: tuple) -> Any:
    """Run collected lean ``steps`` on ``inputs`` (checked by :func:`_lean_inputs`); outputs typed as v2 types them."""
    image = inputs[0].as_subclass(Tensor)
    mask = inputs[1].as_subclass(Tensor) if len(inputs) == 2 else None
    for lean, step in steps:
        image, mask = lean(step, image, mask)
    image = tv_tensors.wrap(image, like=inputs[0]) if type(inputs[0]) is not Tensor else image
    return image if mask is None else (image, tv_tensors.wrap(mask, like=inputs[1]))


class LeanCompose(v2.Compose):
    """A :class:`v2.Compose` (same constructor, steps and results) with a lean path.

    For one image or an ``(image, tv_tensors.Mask)`` pair whose steps are all known (:class:`RandomLongSideResize`,
    :class:`RandomCropUpTo`, :class:`PadTo` and v2's ``RandomHorizontalFlip``, ``Resize``, ``CenterCrop``,
    ``ColorJitter``, ``ToDtype`` with one dtype, ``Normalize``; nested composes of them), it calls the kernels v2
    dispatches to directly on plain tensors: bitwise the same outputs and random draws as :class:`v2.Compose`,
    without the per-step pytree / dispatch / wrapping work. Any other input or step runs :class:`v2.Compose`.
    """

    def forward(self, *inputs: Any) -> Any:
        steps: List[Tuple[_LeanStep, Any]] = []
        if not (_lean_inputs(inputs) and _lean_steps(self.transforms, steps)):
            return super().forward(*inputs)
        return _run_lean(steps, inputs)


def transform_pair(image: tv_tensors.Image, mask: tv_tensors.Mask, joint: Optional[Callable],
                   image_transform: Callable, pad: Optional[Callable]) -> Tuple[Any, Any]:
    """A dataset sample's transforms: ``joint`` on the pair, ``image_transform`` on the image, then ``pad`` on the
    pair (the image made a :class:`tv_tensors.Image` again), exactly as calling them in turn.

    When all three are lean (:class:`LeanCompose` s or v2 composes of known steps, the image transform photometric
    only), they run as one lean pass over plain tensors; else each is called (a :class:`LeanCompose` still lean).

    Returns:
        ``(image, mask)`` as the last stage returns them.

    Raises:
        ValueError: ``image_transform`` changed the image's size (the mask would no longer match it).
    """
    steps: List[Tuple[_LeanStep, Any]] = []
    if (_lean_inputs((image, mask)) and _lean_steps([joint] if joint is not None else [], steps)
            and _lean_steps([image_transform], steps, image_only=True)
            and _lean_steps([pad] if pad is not None else [], steps)):
        return _run_lean(steps, (image, mask))
    if joint is not None:
        image, mask = joint(image, mask)
    size, image = tuple(image.shape[-2:]), image_transform(image)
    if isinstance(image, Tensor) and tuple(image.shape[-2:]) != size:
        raise ValueError(f"transform {image_transform!r} changed the image's size {size} to {tuple(image.shape[-2:])}:"
                         " it runs on the image alone, so the mask no longer matches; resize or crop in the joint "
                         "transform")
    if pad is not None:
        image, mask = pad(tv_tensors.Image(image), mask)
    return image, mask


class _FromPil:
    """A torchvision v1 image pipeline (PyTorch-Encoding's ``Compose([ToTensor(), Normalize(...)])``) called on
    the dataset's ``uint8`` image tensor: handed the PIL image its ``ToTensor`` expects."""

    def __init__(self, transform: Callable) -> None:
        self.transform = transform

    def __call__(self, image: Tensor) -> Any:
        return self.transform(F.to_pil_image(image.as_subclass(Tensor)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.transform!r})"


def user_transform(transform: Callable) -> Callable:
    """A dataset's ``transform`` as the dataset calls it, on a ``uint8`` ``3 x H x W`` image tensor: a v1 pipeline
    that starts from a PIL image (its ``ToTensor`` / ``PILToTensor``) gets one, as in PyTorch-Encoding."""
    from torchvision import transforms as v1

    steps = getattr(transform, "transforms", [transform])
    return _FromPil(transform) if any(isinstance(s, (v1.ToTensor, v1.PILToTensor)) for s in steps) else transform


def image_transform(mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> LeanCompose:
    """The default image-only transform: ``uint8`` to ``float32`` in ``[0, 1]``, then per-channel normalisation."""
    return LeanCompose([v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))])


def denormalize(image: Tensor) -> Tensor:
    """Undo :func:`image_transform`'s default normalisation: a ``3 x H x W`` image in ``[0, 1]``, on the CPU."""
    mean = torch.tensor(IMAGENET_MEAN, dtype=image.dtype).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=image.dtype).view(3, 1, 1)
    return (image.cpu() * std + mean).clamp(0, 1)


def train_joint_transform(base_size: int, crop_size: int, scale_range: Tuple[float, float] = (0.5, 2.0),
                          flip: bool = True, jitter: Optional[float] = None) -> LeanCompose:
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
    return LeanCompose(steps)


def val_joint_transform(crop_size: int) -> LeanCompose:
    """Validation transform: short side resized to ``crop_size`` (masks nearest), then a centre crop."""
    return LeanCompose([v2.Resize(crop_size, antialias=True), v2.CenterCrop(crop_size)])


def to_index_mask(mask: Tensor) -> Tensor:
    """``uint8`` mask with 255 = ignore -> plain ``int64`` tensor with -1 = ignore."""
    mask = mask.as_subclass(Tensor)
    return mask.to(torch.int64).masked_fill_(mask == LABEL_IGNORE, IGNORE_INDEX)
