"""The synchronized-BatchNorm names of PyTorch-Encoding, vacancy and mmcv: thin layers over ``nn.SyncBatchNorm``.

* PyTorch-Encoding and vacancy: ``BatchNorm1d/2d/3d`` = ``SynchronizedBatchNorm1d/2d/3d`` (:class:`SyncBatchNorm`
  with the input-dimension check of ``nn.BatchNorm*d``).
* vacancy: :func:`convert_model`, :func:`patch_sync_batchnorm`.
* mmcv / mmengine: :func:`revert_sync_batchnorm`.

Each is declared in ``encoding.nn`` beside its definition (:func:`~encoding.legacy.declare.old_name`); the status
of each is in ``docs/migration.md``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Tuple

from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..nn.syncbn import _ACTIVATIONS, SyncBatchNorm, rebuild_batchnorm, swap_modules
from ..parallel import DataParallelWithCallback
from .declare import alias, old_name

__all__ = ["BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SynchronizedBatchNorm1d", "SynchronizedBatchNorm2d",
           "SynchronizedBatchNorm3d", "convert_model", "patch_sync_batchnorm", "revert_sync_batchnorm",
           "set_sbn_eps_mode"]


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


@old_name("encoding.nn", "encoding.nn.syncbn", new="encoding.nn.SyncBatchNorm")
class BatchNorm1d(_FixedDimSyncBatchNorm):
    """Synchronized BatchNorm over ``(N, C)`` or ``(N, C, L)`` input (PyTorch-Encoding's and vacancy's name)."""

    _dims, _torch_class = (2, 3), nn.BatchNorm1d


@old_name("encoding.nn", "encoding.nn.syncbn", new="encoding.nn.SyncBatchNorm")
class BatchNorm2d(_FixedDimSyncBatchNorm):
    """Synchronized BatchNorm over ``(N, C, H, W)`` input (PyTorch-Encoding's and vacancy's name)."""

    _dims, _torch_class = (4,), nn.BatchNorm2d


@old_name("encoding.nn", "encoding.nn.syncbn", new="encoding.nn.SyncBatchNorm")
class BatchNorm3d(_FixedDimSyncBatchNorm):
    """Synchronized BatchNorm over ``(N, C, D, H, W)`` input (PyTorch-Encoding's and vacancy's name)."""

    _dims, _torch_class = (5,), nn.BatchNorm3d


SynchronizedBatchNorm1d = alias(BatchNorm1d, "SynchronizedBatchNorm1d", "encoding.nn")  # vacancy's names: the
SynchronizedBatchNorm2d = alias(BatchNorm2d, "SynchronizedBatchNorm2d", "encoding.nn")  # same classes
SynchronizedBatchNorm3d = alias(BatchNorm3d, "SynchronizedBatchNorm3d", "encoding.nn")

#: torch class -> the synchronized class with the same input check.
_SYNC_OF = {cls._torch_class: cls for cls in (BatchNorm1d, BatchNorm2d, BatchNorm3d)}


class _BatchNormXd(_BatchNorm):
    """Plain (unsynchronized) BatchNorm accepting any ``(N, C, *)`` input: what a dimension-agnostic
    :class:`SyncBatchNorm` reverts to."""

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of shape (N, C, *), got {input.dim()}D")


class _BatchNormXdAct(_BatchNormXd):
    """Plain BatchNorm, then the activation of the synchronized layer it reverts: ``activation`` / ``slope`` /
    ``inplace`` (PyTorch-Encoding's activated BatchNorm), then the ``drop`` and ``act`` modules of a
    :class:`~encoding.nn.SyncBatchNormAct` (same children, so the same state-dict keys)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, *, activation: str = "none", slope: float = 0.01,
                 inplace: bool = False, dims: Tuple[int, ...] = (), drop: Optional[nn.Module] = None,
                 act: Optional[nn.Module] = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.activation, self.slope, self.inplace, self._dims = activation, slope, inplace, tuple(dims)
        for name, module in (("drop", drop), ("act", act)):
            if module is not None:
                self.add_module(name, module)

    def _check_input_dim(self, input: Tensor) -> None:
        if self._dims and input.dim() not in self._dims:
            raise ValueError(f"expected {' or '.join(f'{d}D' for d in self._dims)} input, got {input.dim()}D")
        super()._check_input_dim(input)

    def forward(self, input: Tensor) -> Tensor:
        output = _ACTIVATIONS[self.activation](super().forward(input), self.slope, self.inplace)
        for name in ("drop", "act"):
            if name in self._modules:
                output = self._modules[name](output)
        return output

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation}, slope={self.slope}"


@old_name("encoding.nn", new="encoding.nn.convert_sync_batchnorm (and encoding.parallel.DataParallelModel)")
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


@old_name("encoding.nn", new="encoding.nn.convert_sync_batchnorm")
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


@old_name("encoding.nn")
def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """mmcv's ``revert_sync_batchnorm``: every synchronized BatchNorm (ours, ``torch.nn.SyncBatchNorm``) becomes a
    plain one taking over its tensors and flags — ``nn.BatchNorm1d/2d/3d`` for the fixed-dimension names, otherwise
    a BatchNorm that accepts any ``(N, C, *)`` input. Useful to run a model on one CPU or export it. A layer that
    applies an activation (``SyncBatchNorm(activation=...)``, :class:`~encoding.nn.SyncBatchNormAct`'s ``drop`` /
    ``act``) becomes a plain BatchNorm that keeps applying it (same outputs and state-dict keys).
    """
    def to_plain(layer: nn.Module) -> Optional[nn.Module]:
        if not isinstance(layer, (SyncBatchNorm, nn.SyncBatchNorm)):
            return None
        carried = {k: getattr(layer, k) for k in ("drop", "act") if isinstance(getattr(layer, k, None), nn.Module)}
        activation = layer.activation if isinstance(layer, SyncBatchNorm) else "none"
        if activation == "none" and not carried:
            return rebuild_batchnorm(layer, getattr(layer, "_torch_class", _BatchNormXd))
        return rebuild_batchnorm(layer, _BatchNormXdAct, activation=activation, slope=getattr(layer, "slope", 0.01),
                                 inplace=getattr(layer, "inplace", False), dims=getattr(layer, "_dims", ()),
                                 **carried)

    return swap_modules(module, to_plain)


@old_name("encoding.nn")
def set_sbn_eps_mode(mode: str) -> None:
    """Synchronized-BatchNorm's switch between ``"clip"`` (divide by ``sqrt(max(var, eps))``) and ``"plus"``
    (``sqrt(var + eps)``). ``encoding``'s BatchNorm always uses ``"plus"`` (as ``torch.nn.BatchNorm``), so only
    ``"plus"`` is accepted.

    Raises:
        ValueError: any other mode (the message says why).
    """
    if mode != "plus":
        raise ValueError(f"set_sbn_eps_mode({mode!r}): encoding's SyncBatchNorm always normalises by "
                         "sqrt(var + eps), mode 'plus' (torch's BatchNorm); mode 'clip' is not provided")
