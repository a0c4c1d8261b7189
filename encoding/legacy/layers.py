"""Small PyTorch-Encoding layers, each a few lines of torch: ``GlobalAvgPool2d``, ``View``, ``Sum``, ``Mean``,
``Normalize``, ``ConcurrentModule``, ``GramMatrix``, ``DropBlock2D``, ``LabelSmoothing`` and ``EncodingDrop`` (on
:class:`~encoding.nn.Encoding`).

``encoding.nn`` resolves these names through :data:`encoding.legacy.ALIASES` (``docs/migration.md``).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.encoding import Encoding

__all__ = ["GlobalAvgPool2d", "View", "Sum", "Mean", "Normalize", "ConcurrentModule", "GramMatrix", "DropBlock2D",
           "LabelSmoothing", "EncodingDrop"]


class GlobalAvgPool2d(nn.Module):
    """``(N, C, H, W)`` -> ``(N, C)``: the spatial mean."""

    def forward(self, x: Tensor) -> Tensor:
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


class View(nn.Module):
    """``x.view(*size)``; the size may be given as arguments or as one sequence."""

    def __init__(self, *size: Union[int, Sequence[int]]) -> None:
        super().__init__()
        self.size = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)

    def forward(self, x: Tensor) -> Tensor:
        return x.view(self.size)


class Sum(nn.Module):
    """``x.sum(dim, keepdim=keep_dim)``."""

    def __init__(self, dim: int, keep_dim: bool = False) -> None:
        super().__init__()
        self.dim, self.keep_dim = dim, keep_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.sum(self.dim, keepdim=self.keep_dim)


class Mean(Sum):
    """``x.mean(dim, keepdim=keep_dim)``."""

    def forward(self, x: Tensor) -> Tensor:
        return x.mean(self.dim, keepdim=self.keep_dim)


class Normalize(nn.Module):
    """``F.normalize(x, p, dim, eps=1e-8)``: unit ``L_p`` norm along ``dim``."""

    def __init__(self, p: float = 2, dim: int = 1) -> None:
        super().__init__()
        self.p, self.dim = p, dim

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, self.p, self.dim, eps=1e-8)


class ConcurrentModule(nn.ModuleList):
    """Run every module on the same input and concatenate the outputs along the channels (dim 1)."""

    def __init__(self, modules: Optional[Iterable[nn.Module]] = None) -> None:
        super().__init__(modules)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([module(x) for module in self], 1)


class GramMatrix(nn.Module):
    """``(N, C, H, W)`` -> ``(N, C, C)``: feature correlations ``F Fᵀ / (C·H·W)`` (style losses)."""

    def forward(self, x: Tensor) -> Tensor:
        features = x.flatten(2)
        return features @ features.transpose(1, 2) / features[0].numel()


class DropBlock2D(nn.Module):
    """DropBlock (Ghiasi et al., 2018): in training, zero ``block_size x block_size`` squares and rescale the rest.

    Block centres are drawn with probability ``gamma = drop_prob / block_size² · H·W / ((H - b + 1)(W - b + 1))``,
    so about ``drop_prob`` of the activations are dropped; the survivors are scaled by ``numel / kept`` (the mean is
    kept). PyTorch-Encoding's step schedule (``reset_steps``) is not provided: set ``drop_prob`` directly.

    Args:
        drop_prob: the fraction of activations to drop.
        block_size: side of the dropped squares.
        share_channel: drop the same squares in every channel.
    """

    def __init__(self, drop_prob: float, block_size: int, share_channel: bool = False) -> None:
        super().__init__()
        self.drop_prob, self.block_size, self.share_channel = float(drop_prob), block_size, share_channel

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        n, c, h, w = x.shape
        b = self.block_size
        gamma = self.drop_prob / b ** 2 * (h * w) / ((h - b + 1) * (w - b + 1))
        centres = torch.rand(n, 1 if self.share_channel else c, h, w, device=x.device) < gamma
        dropped = F.max_pool2d(centres.to(x.dtype), b, stride=1, padding=b // 2)[..., :h, :w]
        keep = 1 - dropped
        return x * keep * (keep.numel() / keep.sum().clamp(min=1))

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}, block_size={self.block_size}, share_channel={self.share_channel}"


class LabelSmoothing(nn.CrossEntropyLoss):
    """Cross-entropy against targets smoothed by ``smoothing``: ``(1 - s)·NLL + s·mean_c(-log p_c)``."""

    def __init__(self, smoothing: float = 0.1) -> None:
        super().__init__(label_smoothing=smoothing)


class EncodingDrop(Encoding):
    """:class:`~encoding.nn.Encoding` whose smoothing factors are redrawn ``U(-1, 0)`` before every training forward
    and set to ``-0.5`` in eval mode (a dropout-like regulariser; the factors are not learned)."""

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            if self.training:
                self.scale.uniform_(-1.0, 0.0)
            else:
                self.scale.fill_(-0.5)
        return super().forward(x)
