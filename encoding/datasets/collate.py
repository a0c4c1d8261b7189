"""Batching of variable-size samples (``testval`` / ``test`` modes) by padding, with per-sample names kept aside."""
from __future__ import annotations

from typing import Any, List, Sequence

import torch
from torch import Tensor
from torch.utils.data import default_collate

from .transforms import IGNORE_INDEX

__all__ = ["pad_collate", "pad_stack", "list_collate"]


def _per_sample(values: List[Any]) -> List[Any]:
    """Wrap per-sample Python values in ``encoding.parallel.PerSample`` (split with the batch by
    ``DataParallelModel``) when that marker type exists, else return a plain list."""
    try:
        from ..parallel import PerSample
    except ImportError:
        return list(values)
    return PerSample(values)


def pad_stack(tensors: Sequence[Tensor], fill: float) -> Tensor:
    """Stack tensors whose last two (spatial) dimensions differ, padding at the bottom/right with ``fill``.

    Args:
        tensors: same number of dimensions and same leading sizes (e.g. ``3 x H_i x W_i`` or ``H_i x W_i``).
        fill: value of the padded area.

    Returns:
        ``N x ... x max(H_i) x max(W_i)``.
    """
    height = max(t.shape[-2] for t in tensors)
    width = max(t.shape[-1] for t in tensors)
    out = tensors[0].new_full((len(tensors), *tensors[0].shape[:-2], height, width), fill)
    for i, t in enumerate(tensors):
        out[i, ..., :t.shape[-2], :t.shape[-1]] = t
    return out


def pad_collate(batch: Sequence[Any], image_fill: float = 0.0, mask_fill: int = IGNORE_INDEX) -> Any:
    """Collate ``(image, mask[, name])`` / ``(image, name)`` samples of different sizes into one batch.

    Tensors at the same position are padded to the largest height and width in the batch (bottom/right):
    floating-point tensors (images) with ``image_fill`` -- 0 is the mean colour after normalisation -- and integer
    tensors (masks) with ``mask_fill`` (-1 = ignore, so padded pixels never count in losses or metrics). Strings
    (file names) are returned as a per-sample list (``encoding.parallel.PerSample`` when available, so names travel
    with their images through ``DataParallelModel``). Anything else goes through :func:`default_collate`.

    Use with ``functools.partial`` to change the fills:
    ``DataLoader(ds, batch_size=4, collate_fn=pad_collate)``.

    Returns:
        A tuple with one batched entry per sample position (or a single batch if samples are bare tensors).
    """
    first = batch[0]
    if isinstance(first, Tensor):
        return _collate_field(list(batch), image_fill, mask_fill)
    if isinstance(first, (tuple, list)):
        return tuple(_collate_field([sample[i] for sample in batch], image_fill, mask_fill)
                     for i in range(len(first)))
    return default_collate(list(batch))


def _collate_field(values: List[Any], image_fill: float, mask_fill: int) -> Any:
    if all(isinstance(v, Tensor) for v in values):
        if all(v.shape == values[0].shape for v in values):
            return torch.stack(values)
        fill = image_fill if values[0].is_floating_point() else mask_fill
        return pad_stack(values, fill)
    if all(isinstance(v, str) for v in values):
        return _per_sample(values)
    return default_collate(values)


def list_collate(batch: Sequence[Any]) -> tuple:
    """Collate samples into per-field lists without stacking: ``[(image, mask, name), ...]`` becomes
    ``([images], [masks], [names])``, so images of different sizes stay as they are (for
    :func:`encoding.engine.evaluate_images`)."""
    return tuple(list(field) for field in zip(*batch))
