"""PyTorch-Encoding's functional forms that the core does not have: ``batchnormtrain`` and ``NonMaxSuppression``
(``docs/migration.md``)."""
from __future__ import annotations

from typing import Tuple

import torch
import torchvision
from torch import Tensor

__all__ = ["batchnormtrain", "NonMaxSuppression"]


def _per_channel(t: Tensor, x: Tensor) -> Tensor:
    """A per-channel vector ``C`` shaped to broadcast over ``x`` (``N x C x *``)."""
    return t.to(x.dtype).reshape(1, -1, *([1] * (x.dim() - 2)))


def batchnormtrain(input: Tensor, mean: Tensor, std: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    r"""PyTorch-Encoding's BatchNorm with given statistics: :math:`y = (x - \mu) / \sigma \cdot \gamma + \beta`
    per channel (dimension 1), differentiable in every argument.

    Args:
        input: ``N x C`` or ``N x C x *``.
        mean, std, gamma, beta: ``C``-vectors (``std`` is :math:`\sqrt{var + \epsilon}`, already computed).

    Returns:
        A tensor of ``input``'s shape.

    Raises:
        ValueError: an input with fewer than two dimensions.
    """
    if input.dim() < 2:
        raise ValueError(f"batchnormtrain: input must be N x C[ x *], got shape {tuple(input.shape)}")
    return ((input - _per_channel(mean, input)) / _per_channel(std, input) * _per_channel(gamma, input)
            + _per_channel(beta, input))


def NonMaxSuppression(boxes: Tensor, scores: Tensor, threshold: float) -> Tuple[Tensor, Tensor]:
    """PyTorch-Encoding's batched greedy non-maximum suppression, on :func:`torchvision.ops.nms`.

    Boxes are PyTorch-Encoding's ``(x, y, w, h)``. In each batch the boxes are sorted by decreasing score; a box is
    dropped when its IoU with a kept higher-scoring box exceeds ``threshold``.

    Args:
        boxes: ``N x n_boxes x 4``.
        scores: ``N x n_boxes``.
        threshold: the IoU above which a box is suppressed.

    Returns:
        ``(mask, indices)``, both ``N x n_boxes``: ``indices[b]`` sorts batch ``b``'s boxes by decreasing score,
        ``mask[b, i]`` says whether the box ``indices[b, i]`` survives, so ``indices[b][mask[b]]`` are the kept
        boxes, best first. ``mask`` is ``bool`` (PyTorch-Encoding's was ``uint8``, which torch no longer accepts
        as an index).

    Raises:
        ValueError: shapes other than ``N x n x 4`` and ``N x n``.
    """
    if boxes.dim() != 3 or boxes.shape[-1] != 4 or tuple(scores.shape) != tuple(boxes.shape[:2]):
        raise ValueError(f"NonMaxSuppression: boxes must be N x n x 4 and scores N x n, got "
                         f"{tuple(boxes.shape)} and {tuple(scores.shape)}")
    indices = torch.sort(scores, dim=-1, descending=True, stable=True)[1]
    corners = torch.cat([boxes[..., :2], boxes[..., :2] + boxes[..., 2:]], -1)
    mask = torch.zeros(indices.shape, dtype=torch.bool, device=boxes.device)
    for b in range(boxes.shape[0]):
        ordered = corners[b, indices[b]]
        # boxes in score order, scores decreasing with the position: ties keep this order
        positions = torch.arange(ordered.shape[0], 0, -1, device=boxes.device, dtype=ordered.dtype)
        mask[b, torchvision.ops.nms(ordered, positions, float(threshold))] = True
    return mask, indices
