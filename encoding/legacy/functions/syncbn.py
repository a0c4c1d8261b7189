"""PyTorch-Encoding's BatchNorm functional forms, on top of :class:`~encoding.nn.SyncBatchNorm`."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import torch
from torch import Tensor
from torch.func import functional_call

from ...nn.syncbn import SyncBatchNorm

__all__ = ["sum_square", "moments", "syncbatchnorm", "inp_syncbatchnorm"]


def _channel_dims(x: Tensor) -> list:
    return [0] + list(range(2, x.dim()))


def sum_square(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-channel ``(sum x, sum x²)`` of an ``(N, C, *)`` input (differentiable)."""
    dims = _channel_dims(x)
    return x.sum(dims), (x * x).sum(dims)


def moments(x: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-channel ``(E[x], E[x²])`` of an ``(N, C, *)`` input (differentiable)."""
    dims = _channel_dims(x)
    return x.mean(dims), (x * x).mean(dims)


def syncbatchnorm(x: Tensor, gamma: Optional[Tensor], beta: Optional[Tensor], running_mean: Optional[Tensor],
                  running_var: Optional[Tensor], extra: Any = None, sync: bool = True, training: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5, activation: str = "none", slope: float = 0.01) -> Tensor:
    """Functional synchronized BatchNorm with PyTorch-Encoding's signature.

    Runs :class:`~encoding.nn.SyncBatchNorm` on the given tensors: in training, with ``sync`` and an initialised
    ``torch.distributed``, the statistics are those of every process's batch; otherwise of ``x``. The running
    statistics are updated in place as ``nn.BatchNorm`` does (unbiased variance). ``extra`` (PyTorch-Encoding's
    queues between GPUs) is accepted and ignored: across data-parallel replicas use the module, whose replication
    callback sets up the synchronisation.

    Returns:
        The normalised (and activated) input.
    """
    del extra
    layer = SyncBatchNorm(x.shape[1], eps, momentum, affine=gamma is not None,
                          track_running_stats=running_mean is not None, device="meta", sync=sync,
                          activation=activation, slope=slope).train(training)
    tensors = {"weight": gamma, "bias": beta} if gamma is not None else {}
    if running_mean is not None:
        tensors.update(running_mean=running_mean, running_var=running_var,
                       num_batches_tracked=torch.zeros((), dtype=torch.long, device=x.device))
    return functional_call(layer, tensors, (x,))


def inp_syncbatchnorm(*args: Any, **kwargs: Any) -> Tensor:
    """PyTorch-Encoding's in-place variant; here the same as :func:`syncbatchnorm` (the input is not overwritten,
    which autograd would refuse for a tensor it needs)."""
    return syncbatchnorm(*args, **kwargs)
