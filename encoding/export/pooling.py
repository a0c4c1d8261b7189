"""Adaptive average pooling that exports at any input size.

torch's ONNX exporter turns :class:`torch.nn.AdaptiveAvgPool2d` (the pyramid bins 1/2/3/6 of PSPNet and UPerNet) into
pooling kernels fixed to the traced input size: a ``--dynamic`` ONNX file of those networks gave wrong logits at every
other size. :class:`ExportableAdaptiveAvgPool2d` computes the same bins as two matrix products whose averaging
matrices are built from the input's size at run time (``arange`` and comparisons, which every runtime evaluates for the
actual size): bin ``i`` of ``b`` over a length ``n`` averages the elements ``floor(i * n / b)`` to
``ceil((i + 1) * n / b) - 1``, torch's definition. :func:`exportable_pooling` swaps it into (a copy of) a network.
"""
from __future__ import annotations

import copy
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

__all__ = ["ExportableAdaptiveAvgPool2d", "exportable_pooling"]


def _averaging_matrix(bins: int, length: Union[int, torch.SymInt], like: Tensor) -> Tensor:
    """``bins x length``: row ``i`` is ``1 / size`` over the elements of bin ``i`` (torch's bin edges), 0 elsewhere."""
    index = torch.arange(bins, device=like.device).unsqueeze(1)
    start = torch.div(index * length, bins, rounding_mode="floor")
    end = torch.div((index + 1) * length + bins - 1, bins, rounding_mode="floor")
    position = torch.arange(length, device=like.device).unsqueeze(0)
    member = ((position >= start) & (position < end)).to(like.dtype)
    return member / member.sum(1, keepdim=True)


class ExportableAdaptiveAvgPool2d(nn.Module):
    """:class:`torch.nn.AdaptiveAvgPool2d` as ``P_h @ x @ P_w^T`` (equal up to float rounding, at every size).

    Args:
        output_size: ``(bins_h, bins_w)`` or one int (``None`` entries: that dimension kept, as torch).
    """

    def __init__(self, output_size: Union[int, Tuple[Optional[int], Optional[int]]]) -> None:
        super().__init__()
        pair = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
        self.output_size = pair

    def forward(self, x: Tensor) -> Tensor:
        height, width = x.shape[-2:]
        bins_h = self.output_size[0] if self.output_size[0] is not None else height
        bins_w = self.output_size[1] if self.output_size[1] is not None else width
        rows = _averaging_matrix(bins_h, height, x)
        cols = _averaging_matrix(bins_w, width, x)
        return torch.matmul(torch.matmul(rows, x), cols.transpose(0, 1))


def exportable_pooling(model: nn.Module) -> nn.Module:
    """``model`` itself when it has no :class:`~torch.nn.AdaptiveAvgPool2d`, else a deep copy in which each one is
    an :class:`ExportableAdaptiveAvgPool2d` of the same output size (the original model is left as it was)."""
    if not any(isinstance(m, nn.AdaptiveAvgPool2d) for m in model.modules()):
        return model
    model = copy.deepcopy(model)
    for parent in list(model.modules()):
        for name, child in parent.named_children():
            if isinstance(child, nn.AdaptiveAvgPool2d):
                setattr(parent, name, ExportableAdaptiveAvgPool2d(child.output_size))
    return model
