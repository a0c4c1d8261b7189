"""Differentiable communication between replicas: broadcast (for replication) and all-reduce (for SyncBatchNorm).

When every device is a distinct CUDA device, torch's coalesced primitives (``broadcast_coalesced``,
``reduce_add_coalesced``) do the work; otherwise (CPU replicas, mixed devices) a generic autograd-correct path
copies with ``Tensor.to`` and sums on the first device. On a repeated CPU device the generic broadcast aliases the
source tensor instead of copying it.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd import Function
from torch.nn.parallel import comm as _cuda_comm
from torch.nn.parallel._functions import Broadcast as _CudaBroadcast

from .devices import all_distinct_cuda

__all__ = ["broadcast", "allreduce", "AllReduce"]


def _reduce_to(tensors: Sequence[Tensor], device: torch.device) -> Tensor:
    total = tensors[0].to(device)
    for t in tensors[1:]:
        total = total + t.to(device)
    return total


class _GenericBroadcast(Function):
    """Copy each input to each device; backward sums the copies' gradients on the input's device."""

    @staticmethod
    def forward(ctx, devices: Sequence[torch.device], *inputs: Tensor) -> Tuple[Tensor, ...]:
        ctx.set_materialize_grads(False)
        ctx.num_inputs = len(inputs)
        ctx.source_devices = [t.device for t in inputs]
        outputs = tuple(t if t.device == d else t.to(d) for d in devices for t in inputs)
        constant = [not needs for needs in ctx.needs_input_grad[1:]]
        ctx.mark_non_differentiable(*(o for k, o in enumerate(outputs) if constant[k % len(inputs)]))
        return outputs

    @staticmethod
    def backward(ctx, *grads: Tensor):
        n = ctx.num_inputs
        result: List = [None]
        for k, device in enumerate(ctx.source_devices):
            parts = [g for g in grads[k::n] if g is not None]
            result.append(_reduce_to(parts, device) if parts else None)
        return tuple(result)


def _copy_detached(t: Tensor, device: torch.device, first: bool) -> Tensor:
    if first and t.device == device:
        return t
    return t.detach().to(device, copy=True)


def broadcast(tensors: Sequence[Tensor], devices: Sequence[torch.device], detach: bool = False) -> List[List[Tensor]]:
    """Copies of ``tensors`` for every device.

    Args:
        tensors: the source tensors (e.g. a module's parameters), all on ``devices[0]``.
        devices: one entry per replica; may repeat.
        detach: if True the copies are outside autograd and every copy except replica 0's is a real copy (safe to
            update in place, e.g. BatchNorm running stats); replica 0 on the source device gets the source tensors.
            If False the copies are differentiable and backward sums their gradients into the sources.

    Returns:
        ``copies[j][k]`` = tensor ``k`` on ``devices[j]``.
    """
    tensors = list(tensors)
    if not tensors:
        return [[] for _ in devices]
    if detach:
        if all_distinct_cuda(devices):
            return [list(group) for group in _cuda_comm.broadcast_coalesced(tensors, [d.index for d in devices])]
        return [[_copy_detached(t, d, j == 0) for t in tensors] for j, d in enumerate(devices)]
    if all_distinct_cuda(devices):
        flat = _CudaBroadcast.apply([d.index for d in devices], *tensors)
    else:
        flat = _GenericBroadcast.apply(list(devices), *tensors)
    n = len(tensors)
    return [list(flat[j * n:(j + 1) * n]) for j in range(len(devices))]


def _allreduce_values(num_inputs: int, inputs: Sequence[Tensor]) -> Tuple[Tensor, ...]:
    groups = [list(inputs[i:i + num_inputs]) for i in range(0, len(inputs), num_inputs)]
    devices = [g[0].device for g in groups]
    if all_distinct_cuda(devices):
        sums = _cuda_comm.reduce_add_coalesced(groups, devices[0].index)
        copies = _cuda_comm.broadcast_coalesced(sums, [d.index for d in devices])
        return tuple(t for group in copies for t in group)
    sums = [_reduce_to([g[k] for g in groups], devices[0]) for k in range(num_inputs)]
    return tuple(s.clone() if j > 0 and d == devices[0] else s.to(d, copy=j > 0)
                 for j, d in enumerate(devices) for s in sums)


class AllReduce(Function):
    """Differentiable cross-replica sum (see :func:`allreduce`)."""

    @staticmethod
    def forward(ctx, num_inputs: int, *inputs: Tensor) -> Tuple[Tensor, ...]:
        ctx.num_inputs = num_inputs
        return _allreduce_values(num_inputs, inputs)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        return (None,) + AllReduce.apply(ctx.num_inputs, *grads)


def allreduce(num_inputs: int, *inputs: Tensor) -> Tuple[Tensor, ...]:
    """Differentiable all-reduce (sum) across replicas.

    Args:
        num_inputs: how many tensors each replica contributes.
        *inputs: grouped per replica: ``x0_r0, x1_r0, ..., x0_r1, x1_r1, ...``; tensor ``k`` of every replica must
            have the same shape. Replica ``r``'s device is the device of its first tensor.

    Returns:
        A tuple laid out like ``inputs`` where entry ``(r, k)`` is ``sum_r' x_k_r'`` on replica ``r``'s device.
        Backward all-reduces the gradients the same way, so every replica's input receives the sum of all
        replicas' output gradients.

    Example:
        >>> a, b = torch.tensor([1.0]), torch.tensor([2.0])
        >>> allreduce(1, a, b)
        (tensor([3.]), tensor([3.]))
    """
    if num_inputs < 1 or len(inputs) % num_inputs:
        raise ValueError(f"allreduce got {len(inputs)} tensors, not a multiple of num_inputs={num_inputs}")
    return AllReduce.apply(num_inputs, *inputs)
