"""Names that users of PyTorch-Encoding, Synchronized-BatchNorm (vacancy) and mmcv import, as thin layers over our core.

Everything here is a small alias or a few lines on top of :class:`~encoding.nn.SyncBatchNorm`,
:class:`~encoding.nn.Encoding` or torch; the status of each name is in ``docs/migration.md``.

* PyTorch-Encoding: ``BatchNorm1d/2d/3d`` (its old synchronized BatchNorm names), ``GlobalAvgPool2d``, ``View``,
  ``Sum``, ``Mean``, ``Normalize``, ``ConcurrentModule``, ``GramMatrix``, ``DropBlock2D``, ``LabelSmoothing``,
  ``EncodingDrop``.
* vacancy: ``SynchronizedBatchNorm1d/2d/3d``, ``convert_model``, ``patch_sync_batchnorm``.
* mmcv / mmengine: ``revert_sync_batchnorm``.
"""
from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..parallel import DataParallelWithCallback
from .encoding import Encoding
from .syncbn import SyncBatchNorm, rebuild_batchnorm, swap_modules

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SynchronizedBatchNorm1d", "SynchronizedBatchNorm2d",
           "SynchronizedBatchNorm3d", "convert_model", "patch_sync_batchnorm", "revert_sync_batchnorm",
           "GlobalAvgPool2d", "View", "Sum", "Mean", "Normalize", "ConcurrentModule", "GramMatrix", "DropBlock2D",
           "LabelSmoothing", "EncodingDrop"]


# -- synchronized BatchNorm with a fixed input dimensionality ---------------------------------------------------------
class _FixedDimSyncBatchNorm(SyncBatchNorm):
    """:class:`SyncBatchNorm` that accepts only the input dimensionalities of one ``nn.BatchNorm*d``."""

    _dims: Tuple[int, ...] = ()
    _torch_class: type = _BatchNorm

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() not in self._dims:
            raise ValueError(f"{type(self).__name__} expected {' or '.join(f'{d}D' for d in self._dims)} input, "
                             f"got {input.dim()}D ({tuple(input.shape)})")
        super()._check_input_dim(input)


class BatchNorm1d(_FixedDimSyncBatchNorm):
    """Synchronized BatchNorm over ``(N, C)`` or ``(N, C, L)`` input (PyTorch-Encoding's and vacancy's name)."""

    _dims, _torch_class = (2, 3), nn.BatchNorm1d


class BatchNorm2d(_FixedDimSyncBatchNorm):
    """Synchronized BatchNorm over ``(N, C, H, W)`` input (PyTorch-Encoding's and vacancy's name)."""

    _dims, _torch_class = (4,), nn.BatchNorm2d


class BatchNorm3d(_FixedDimSyncBatchNorm):
    """Synchronized BatchNorm over ``(N, C, D, H, W)`` input (PyTorch-Encoding's and vacancy's name)."""

    _dims, _torch_class = (5,), nn.BatchNorm3d


SynchronizedBatchNorm1d = BatchNorm1d
SynchronizedBatchNorm2d = BatchNorm2d
SynchronizedBatchNorm3d = BatchNorm3d

#: torch class -> the synchronized class with the same input check.
_SYNC_OF = {cls._torch_class: cls for cls in (BatchNorm1d, BatchNorm2d, BatchNorm3d)}


class _BatchNormXd(_BatchNorm):
    """Plain (unsynchronized) BatchNorm accepting any ``(N, C, *)`` input: what a dimension-agnostic
    :class:`SyncBatchNorm` reverts to."""

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of shape (N, C, *), got {input.dim()}D")


def convert_model(module: nn.Module) -> nn.Module:
    """vacancy's ``convert_model``: ``nn.BatchNorm1d/2d/3d`` -> ``SynchronizedBatchNorm1d/2d/3d`` (same tensors and
    flags), and a ``torch.nn.DataParallel`` -> :class:`~encoding.parallel.DataParallelWithCallback` on its devices.

    Example:
        >>> type(convert_model(nn.Sequential(nn.BatchNorm2d(3)))[0]).__name__
        'BatchNorm2d'
    """
    if isinstance(module, nn.DataParallel) and not isinstance(module, DataParallelWithCallback):
        return DataParallelWithCallback(convert_model(module.module), module.device_ids,
                                        getattr(module, "output_device", None), getattr(module, "dim", 0))

    def to_sync(layer: nn.Module) -> Optional[nn.Module]:
        target = _SYNC_OF.get(type(layer))
        return None if target is None else rebuild_batchnorm(layer, target)

    return swap_modules(module, to_sync)


@contextlib.contextmanager
def patch_sync_batchnorm() -> Iterator[None]:
    """vacancy's context manager: ``nn.BatchNorm1d/2d/3d`` built inside it are synchronized ones.

    Example:
        >>> with patch_sync_batchnorm():
        ...     layer = nn.BatchNorm2d(3)
        >>> isinstance(layer, SyncBatchNorm)
        True
    """
    originals = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d = BatchNorm1d, BatchNorm2d, BatchNorm3d
    try:
        yield
    finally:
        nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d = originals


def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """mmcv's ``revert_sync_batchnorm``: every synchronized BatchNorm (ours, ``torch.nn.SyncBatchNorm``) becomes a
    plain one taking over its tensors and flags — ``nn.BatchNorm1d/2d/3d`` for the fixed-dimension names, otherwise
    a BatchNorm that accepts any ``(N, C, *)`` input. Useful to run a model on one CPU or export it.
    """
    def to_plain(layer: nn.Module) -> Optional[nn.Module]:
        if not isinstance(layer, (SyncBatchNorm, nn.SyncBatchNorm)):
            return None
        return rebuild_batchnorm(layer, getattr(layer, "_torch_class", _BatchNormXd))

    return swap_modules(module, to_plain)


# -- small PyTorch-Encoding layers ---------------------------------------------------------------------------------
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
