"""The autograd functions of :class:`~encoding.nn.SyncBatchNorm` and its statistics helpers.

Kept apart from the module (as torch keeps ``nn/modules/_functions.py``): :class:`GradientCarrier` (the input
gradient summed in float32 and rounded once), :class:`LocalMoments` (per-channel mean and biased variance with a fused
backward), :class:`Normalize` (BatchNorm with differentiable statistics, on torch's fused kernels),
:class:`DistAllReduce` (a differentiable ``torch.distributed`` sum), and the all-gather table helpers :func:`slot` /
:func:`merge_moments` (Chan's parallel formula). Nothing here imports :mod:`encoding.nn.syncbn`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.autograd import Function

__all__ = ["GradientCarrier", "LocalMoments", "Normalize", "DistAllReduce", "slot", "merge_moments", "stats_dtype"]


# -- statistics ---------------------------------------------------------------------------------------------------
def slot(row: Tensor, index: int, size: int) -> Tensor:
    """``row`` placed in line ``index`` of a ``size x len(row)`` zero table (a sum of these is an all-gather)."""
    return F.pad(row.unsqueeze(0), (0, 0, index, size - index - 1))


def merge_moments(table: Tensor, channels: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Whole-batch mean, biased variance and count from per-participant ``[count, mean(C), var(C)]`` rows."""
    counts = table[:, :1]
    means = table[:, 1:channels + 1]
    variances = table[:, channels + 1:]
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    var = (counts * (variances + (means - mean) ** 2)).sum(0) / total
    return mean, var, total


def stats_dtype(input: Tensor) -> torch.dtype:
    """Statistics are kept in float32 at least (float64 inputs keep float64)."""
    return input.dtype if input.dtype in (torch.float32, torch.float64) else torch.float32


def channel_view(vector: Tensor, input: Tensor) -> Tensor:
    return vector.view((1, -1) + (1,) * (input.dim() - 2))


class GradientCarrier(Function):
    """A stand-in for ``input`` (a broadcast zero: no memory) through which :class:`LocalMoments` and
    :class:`Normalize` return their input-gradient terms in the statistics' precision.

    Autograd sums the two terms (the direct one and the one through the batch statistics) in that precision and the
    backward rounds the sum to ``input``'s dtype once, as torch's fused BatchNorm kernel does: with bf16 / fp16 inputs
    and float32 statistics, the gradient is that of ``nn.BatchNorm`` (rounding each term and their sum separately
    would not be).
    """

    @staticmethod
    def forward(ctx, input: Tensor) -> Tensor:
        ctx.dtype = input.dtype
        return input.new_zeros((), dtype=stats_dtype(input)).expand(input.shape)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.to(ctx.dtype)


class LocalMoments(Function):
    """Per-channel mean and biased variance of ``(N, C, *)`` input; the backward is one fused pass over the input.

    Two passes (mean, then the mean of centred squares): as stable as Welford's ``var_mean`` and, on CPU, an order
    of magnitude faster. Called as ``LocalMoments.apply(carrier, input)`` with ``carrier = GradientCarrier.apply(
    input)``: the input gradient goes to the carrier, in the statistics' precision.
    """

    @staticmethod
    def forward(ctx, carrier: Tensor, input: Tensor) -> Tuple[Tensor, Tensor]:
        dims = [0] + list(range(2, input.dim()))
        mean = input.mean(dims, dtype=stats_dtype(input))
        var = (input - channel_view(mean, input)).square_().mean(dims)
        ctx.save_for_backward(input, mean)
        return mean, var

    @staticmethod
    def backward(ctx, grad_mean: Tensor, grad_var: Tensor) -> Tuple[Tensor, None]:
        input, mean = ctx.saved_tensors
        count = input.numel() // input.shape[1]
        # d/dx [mean, var] . [g_mean, g_var] = g_mean / n + 2 g_var (x - mean) / n = a * x + b
        a = grad_var * (2.0 / count)
        b = grad_mean / count - a * mean
        return torch.addcmul(channel_view(b, input), input, channel_view(a, input)), None


class Normalize(Function):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` with differentiable ``mean`` and ``var``.

    The forward is torch's fused BatchNorm kernel in inference form (given statistics); the backward reduces
    ``sum(g)`` and ``sum(g * x_hat)`` with torch's kernel and forms the input gradient ``g * weight * invstd`` in the
    statistics' precision (returned to the :class:`GradientCarrier`); the gradients of ``mean`` and ``var`` follow
    from the reduced ones: ``-w * invstd * sum(g)`` and ``-w * invstd^2 / 2 * sum(g * x_hat)``. Called as
    ``Normalize.apply(carrier, input, mean, var, weight, bias, eps)``.
    """

    @staticmethod
    def forward(ctx, carrier: Tensor, input: Tensor, mean: Tensor, var: Tensor, weight: Optional[Tensor],
                bias: Optional[Tensor], eps: float) -> Tensor:
        ctx.eps = eps
        ctx.save_for_backward(input, mean, var, weight)
        return torch.batch_norm(input, weight, bias, mean, var, False, 0.0, eps, torch.backends.cudnn.enabled)

    @staticmethod
    def backward(ctx, grad: Tensor):
        input, mean, var, weight = ctx.saved_tensors
        invstd = torch.rsqrt(var + ctx.eps)
        kernel_weight = weight if weight is not None else torch.ones_like(invstd)
        if torch.is_grad_enabled():  # create_graph=True: the reductions in plain ops, which autograd differentiates
            grad_weight, grad_bias = _reductions(grad, input, mean, invstd)
        else:  # torch's kernel in inference form (train=False); CUDA's also wants the statistics as save_mean /
            # save_invstd and a defined weight
            grad = like_input(grad, input)
            _, grad_weight, grad_bias = torch.ops.aten.native_batch_norm_backward(
                grad, input, kernel_weight, mean, var, mean, invstd, False, ctx.eps, [False, True, True])
        scale = kernel_weight.to(invstd.dtype) * invstd
        grad_input = grad * channel_view(scale, input) if ctx.needs_input_grad[0] else None
        grad_mean = -scale * grad_bias.to(invstd.dtype)
        grad_var = -0.5 * scale * invstd * grad_weight.to(invstd.dtype)
        return (grad_input, None, grad_mean, grad_var,
                grad_weight if weight is not None and ctx.needs_input_grad[4] else None,
                grad_bias if ctx.needs_input_grad[5] else None, None)


def _reductions(grad: Tensor, input: Tensor, mean: Tensor, invstd: Tensor) -> Tuple[Tensor, Tensor]:
    """``sum(g * x_hat)`` and ``sum(g)`` per channel, in the statistics' precision, as differentiable torch ops (the
    kernel's backward has no derivative with respect to the statistics)."""
    dims = [0] + list(range(2, input.dim()))
    grad = grad.to(invstd.dtype)
    x_hat = (input.to(invstd.dtype) - channel_view(mean, input)) * channel_view(invstd, input)
    return (grad * x_hat).sum(dims), grad.sum(dims)


def like_input(grad: Tensor, input: Tensor) -> Tensor:
    """``grad`` laid out like ``input`` (e.g. channels_last): torch's CPU kernel takes a slower, lower-precision
    mixed-layout path otherwise (it sums ``grad_bias`` in bf16)."""
    if grad.stride() == input.stride():
        return grad
    return torch.empty_like(input, dtype=grad.dtype).copy_(grad)


class DistAllReduce(Function):
    """Sum across the ranks of a process group; the backward sums the gradients the same way."""

    @staticmethod
    def forward(ctx, tensor: Tensor, group: object) -> Tensor:
        ctx.group = group
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, None]:
        return DistAllReduce.apply(grad, ctx.group), None  # itself: differentiable again under create_graph=True
