"""Synchronized BatchNorm for data-parallel replicas (threads) and ``torch.distributed`` processes, in pure PyTorch.

One class, :class:`SyncBatchNorm`, normalises with the statistics of the *whole* batch:

1. across the replicas of :class:`encoding.parallel.DataParallelModel` (or a ``torch.nn.DataParallel`` patched with
   :func:`encoding.parallel.patch_replication_callback`): the copies of a layer meet in a rendezvous created by the
   replication callback ``__data_parallel_replicate__``; the last copy to arrive all-reduces their statistics with
   the differentiable :func:`encoding.parallel.allreduce` (one autograd node, so the backward is exact even though
   CPU replicas run their backward in a single thread);
2. across processes when ``torch.distributed`` is initialised and the layer is training (any backend, CPU with gloo
   included), optionally within a ``process_group``;
3. on a single device, and in eval mode, it *is* ``nn.BatchNorm``: the forward calls the same ``F.batch_norm``.

Under activation checkpointing (:mod:`encoding.nn.recompute`) the recomputation in the backward reuses the statistics
its forward synchronised: no second all-reduce, and the running statistics are updated once per step.

Every participant contributes its count, mean and (biased) variance; they are merged with Chan's parallel formula
``var = sum_r n_r * (var_r + (mean_r - mean)^2) / N``, which is exact for uneven splits and, unlike
``E[x^2] - E[x]^2``, free of cancellation. Gradients flow through the merge and the all-reduce, whose backward
all-reduces the gradients of the statistics, so the backward equals the single-device one.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..parallel import ReplicaAbortedError, allreduce, get_replica_context
from ._functions import DistAllReduce, GradientCarrier, LocalMoments, Normalize, merge_moments, slot, stats_dtype
from .recompute import is_recomputing, replay_in_recomputation

__all__ = ["SyncBatchNorm", "SyncBatchNormAct", "convert_sync_batchnorm"]

_POLL_SECONDS = 0.05


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation over the whole batch of data-parallel replicas or distributed processes.

    Accepts inputs of any dimensionality ``(N, C)``, ``(N, C, L)``, ``(N, C, H, W)``, ``(N, C, D, H, W)``.
    Running statistics follow ``nn.BatchNorm``: ``running = (1 - momentum) * running + momentum * batch`` with the
    unbiased variance of the whole batch, and ``momentum=None`` gives the cumulative average. In replica mode only the
    master copy (replica 0, which shares the original module's buffers) updates them; in process mode every rank
    does, with identical values. In eval mode without running statistics (``track_running_stats=False``) replicas
    normalise with the whole batch's statistics too (torch's ``nn.SyncBatchNorm`` normalises each share alone);
    distributed processes then normalise their own batches, whose number may differ from rank to rank.

    Failures never deadlock: a copy waiting for the others polls the replica context's ``failed`` event and raises
    :class:`encoding.parallel.ReplicaAbortedError` (so the caller sees the failing replica's own exception), and gives
    up after :attr:`sync_timeout` seconds with a ``TimeoutError`` naming the replicas that never arrived (e.g. one
    that skipped the layer).

    Only ``num_features``, ``eps`` and ``momentum`` may be positional: the next parameter is ``affine`` in torch's
    ``nn.SyncBatchNorm`` but ``sync`` in PyTorch-Encoding's, so a 4th positional argument raises ``TypeError``.

    Args:
        num_features: number of channels ``C``.
        eps: added to the variance for numerical stability.
        momentum: factor of the running-statistics update; ``None`` for the cumulative moving average.
        *args: refused (see above).
        affine: learnable per-channel scale and shift.
        track_running_stats: keep running mean / variance (used in eval mode).
        process_group: the ``torch.distributed`` group to synchronise within (default: the whole world).
        device: where to create the parameters and buffers.
        dtype: their dtype.
        sync: synchronise the statistics (``False``: every replica or process normalises its own share, like
            ``nn.BatchNorm`` under ``nn.DataParallel``; PyTorch-Encoding's keyword).
        activation: applied after the normalisation: ``"none"`` (default), ``"relu"``, ``"leaky_relu"`` or
            ``"elu"`` (PyTorch-Encoding's in-place activated BatchNorm).
        slope: negative slope of ``"leaky_relu"`` (``alpha`` of ``"elu"``).
        inplace: apply the activation in place on the normalised output (saves one tensor; the input is never
            overwritten).

    Shape:
        - Input: ``(N, C, *)``.
        - Output: same shape as the input.

    Example:
        >>> from encoding.parallel import DataParallelModel
        >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), SyncBatchNorm(8), nn.ReLU())
        >>> outputs = DataParallelModel(net, device_ids=["cpu"] * 2)(torch.randn(5, 3, 8, 8))
        >>> [o.shape[0] for o in outputs]
        [3, 2]
    """

    #: Seconds a copy waits for the others at one synchronisation before raising ``TimeoutError``.
    sync_timeout: float = 300.0

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, *args: object,
                 affine: bool = True, track_running_stats: bool = True, process_group: Optional[object] = None,
                 device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None, sync: bool = True,
                 activation: str = "none", slope: float = 0.01, inplace: bool = False) -> None:
        if args:  # torch's 4th parameter is affine, PyTorch-Encoding's sync: a positional one would be misread
            raise TypeError(f"{type(self).__name__}: pass the arguments after momentum by keyword (got {args[0]!r} "
                            f"as the 4th positional argument: `affine` in torch's and vacancy's signature, `sync` in "
                            f"PyTorch-Encoding's)")
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        if activation not in _ACTIVATIONS:
            raise ValueError(f"SyncBatchNorm activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.process_group = process_group
        self.sync = sync
        self.activation, self.slope, self.inplace = activation, slope, inplace
        self._rendezvous: Optional[_Rendezvous] = None  # set on replica copies only
        self._copy_id = 0
        self._sync_calls = 0

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm expects an input of shape (N, C, *), got {input.dim()}D "
                             f"({tuple(input.shape)})")
        if input.shape[1] != self.num_features:
            raise ValueError(f"SyncBatchNorm({self.num_features}) got an input with {input.shape[1]} channels "
                             f"({tuple(input.shape)})")

    def __data_parallel_replicate__(self, ctx: object, copy_id: int) -> None:
        """Replication callback: join the copies of this layer in one rendezvous (master copy creates it)."""
        if copy_id == 0 or not hasattr(ctx, "sync_batchnorm"):
            ctx.sync_batchnorm = _Rendezvous()
        self._rendezvous = ctx.sync_batchnorm
        self._rendezvous.size += 1
        self._copy_id = copy_id
        self._sync_calls = 0

    def forward(self, input: Tensor) -> Tensor:
        output = self._normalize(input)
        if self.activation == "none":
            return output
        return _ACTIVATIONS[self.activation](output, self.slope, self.inplace)

    def _normalize(self, input: Tensor) -> Tensor:
        if not (self.training or self.running_mean is None) or not self.sync:  # eval with running statistics
            return super().forward(input)
        if self._rendezvous is not None and self._rendezvous.size > 1:
            if _group_size(self.process_group) > 1:
                raise RuntimeError("SyncBatchNorm cannot synchronise across data-parallel replicas and "
                                   "torch.distributed processes at once; use one process per device (DDP) or "
                                   "DataParallelModel in a single process")
            return self._sync_forward(input, self._exchange_replicas, update_running=self._copy_id == 0)
        if self.training and _group_size(self.process_group) > 1:  # eval: the ranks' batches need not line up
            return self._sync_forward(input, self._exchange_processes, update_running=True)
        return super().forward(input)

    # -- synchronised path ----------------------------------------------------------------------------------------
    def _sync_forward(self, input: Tensor, exchange: Callable[[Tensor], Tensor], update_running: bool) -> Tensor:
        self._check_input_dim(input)
        channels = input.shape[1]
        count = input.numel() // channels
        # both input-gradient terms (direct, through the statistics) are summed in float32 and rounded once
        carrier = GradientCarrier.apply(input)
        if count:
            mean, var = LocalMoments.apply(carrier, input)
        else:  # an empty shard contributes nothing
            mean = var = input.new_zeros(channels, dtype=stats_dtype(input))
        row = torch.cat([mean.new_full((1,), float(count)), mean, var])
        # under activation checkpointing, the recomputation reuses the table this forward synchronised
        mean, var, total = merge_moments(replay_in_recomputation(lambda: exchange(row)), channels)
        if update_running and self.track_running_stats and not is_recomputing():
            self._update_running_stats(mean, var, total)
        weight, bias = (None, None) if self.weight is None else (self.weight.to(mean.dtype), self.bias.to(mean.dtype))
        return Normalize.apply(carrier, input, mean, var, weight, bias, self.eps)

    @torch.no_grad()
    def _update_running_stats(self, mean: Tensor, var: Tensor, total: Tensor) -> None:
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * (total / (total - 1).clamp(min=1))
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)

    def _exchange_replicas(self, row: Tensor) -> Tensor:
        """All-gather ``row`` among the copies of this layer: returns the ``copies x len(row)`` table."""
        call = self._sync_calls
        self._sync_calls += 1
        size, index = self._rendezvous.size, self._copy_id
        context = get_replica_context()
        failed = context.failed if context is not None else None
        return self._rendezvous.exchange(call, index, slot(row, index, size), failed, self.sync_timeout)

    def _exchange_processes(self, row: Tensor) -> Tensor:
        """All-gather ``row`` among the ranks of the process group: returns the ``ranks x len(row)`` table."""
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        return DistAllReduce.apply(slot(row, dist.get_rank(group), dist.get_world_size(group)), group)

    def extra_repr(self) -> str:
        extra = "" if self.sync else ", sync=False"
        if self.activation != "none":
            extra += f", activation={self.activation}, slope={self.slope}"
        return super().extra_repr() + extra

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group: Optional[object] = None) -> nn.Module:
        """Replace every BatchNorm layer of ``module`` with this class (see :func:`convert_sync_batchnorm`)."""
        return _convert(module, process_group, cls)


#: ``activation`` name -> ``fn(output, slope, inplace)``.
_ACTIVATIONS: Dict[str, Callable[[Tensor, float, bool], Tensor]] = {
    "none": lambda x, slope, inplace: x,
    "relu": lambda x, slope, inplace: F.relu(x, inplace=inplace),
    "leaky_relu": lambda x, slope, inplace: F.leaky_relu(x, slope, inplace=inplace),
    "elu": lambda x, slope, inplace: F.elu(x, slope, inplace=inplace),
}


class SyncBatchNormAct(SyncBatchNorm):
    """:class:`SyncBatchNorm`, then ``drop``, then ``act`` (modules; default identity): what
    :func:`convert_sync_batchnorm` makes of timm's ``BatchNormAct2d``, same computation and state-dict keys."""

    def __init__(self, num_features: int, *args: object, drop: Optional[nn.Module] = None,
                 act: Optional[nn.Module] = None, **kwargs: object) -> None:
        super().__init__(num_features, *args, **kwargs)
        self.drop, self.act = drop or nn.Identity(), act or nn.Identity()

    def forward(self, input: Tensor) -> Tensor:
        return self.act(self.drop(super().forward(input)))


def convert_sync_batchnorm(module: nn.Module, process_group: Optional[object] = None) -> nn.Module:
    """Replace every ``BatchNorm1d/2d/3d`` (and ``torch.nn.SyncBatchNorm``) in ``module`` with :class:`SyncBatchNorm`.

    The new layers take over the old ones' parameters and buffers (the same tensors, so ``requires_grad`` and any
    optimizer built on ``module.parameters()`` stay valid) and their training flag. Children are replaced in place.
    A BatchNorm layer carrying ``drop`` / ``act`` modules (timm's ``BatchNormAct2d``) becomes a
    :class:`SyncBatchNormAct` that keeps applying them.

    Args:
        module: the network (or a single BatchNorm layer).
        process_group: ``torch.distributed`` group for the converted layers (default: a ``torch.nn.SyncBatchNorm``'s
            own group, else the whole world); also set on layers that already are :class:`SyncBatchNorm`.

    Returns:
        ``module`` with its BatchNorm layers replaced, or the new layer if ``module`` itself was one.

    Example:
        >>> net = convert_sync_batchnorm(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8)))
        >>> type(net[1]).__name__
        'SyncBatchNorm'
    """
    return _convert(module, process_group, SyncBatchNorm)


def _convert(module: nn.Module, process_group: Optional[object], cls: type) -> nn.Module:
    def to_sync(layer: nn.Module) -> Optional[nn.Module]:
        if isinstance(layer, cls):
            if process_group is not None:
                layer.process_group = process_group
            return None
        if isinstance(layer, _BatchNorm):  # timm's BatchNormAct2d carries its drop and act modules
            carried = {k: getattr(layer, k) for k in ("drop", "act") if isinstance(getattr(layer, k, None), nn.Module)}
            if carried and not issubclass(SyncBatchNormAct, cls):
                raise ValueError(f"{type(layer).__name__} carries {', '.join(carried)}: it converts to "
                                 f"SyncBatchNormAct, not {cls.__name__}")
            group = process_group if process_group is not None else getattr(layer, "process_group", None)
            return rebuild_batchnorm(layer, SyncBatchNormAct if carried else cls, process_group=group, **carried)
        return None

    return swap_modules(module, to_sync)


def swap_modules(module: nn.Module, replace: Callable[[nn.Module], Optional[nn.Module]]) -> nn.Module:
    """Replace, depth first and in place, every submodule for which ``replace`` returns a module.

    Args:
        module: the network (``module`` itself may be replaced too).
        replace: maps a module to its replacement, or to ``None`` to keep it (its children are still visited).

    Returns:
        ``module``, or its replacement.
    """
    result = replace(module) or module
    for name, child in module.named_children():
        result.add_module(name, swap_modules(child, replace))
    return result


def rebuild_batchnorm(layer: _BatchNorm, cls: type, **kwargs: object) -> nn.Module:
    """A ``cls`` BatchNorm layer that takes over ``layer``'s parameter and buffer tensors, flags and qconfig.

    Args:
        layer: an initialised BatchNorm-like layer (``num_features``, ``eps``, ``momentum``, ``affine``,
            ``track_running_stats``).
        cls: the class to build, called as ``cls(num_features, eps=, momentum=, affine=, track_running_stats=,
            **kwargs)``.

    Raises:
        ValueError: ``layer`` is a lazy layer that has not been initialised.
    """
    if isinstance(layer, nn.modules.lazy.LazyModuleMixin) and layer.has_uninitialized_params():
        raise ValueError(f"cannot convert an uninitialised {type(layer).__name__}; run a forward first")
    result = cls(layer.num_features, eps=layer.eps, momentum=layer.momentum, affine=layer.affine,
                 track_running_stats=layer.track_running_stats, **kwargs)
    for name, param in layer.named_parameters(recurse=False):
        setattr(result, name, param)
    for name, buf in layer.named_buffers(recurse=False):
        setattr(result, name, buf)
    result.train(layer.training)
    if hasattr(layer, "qconfig"):
        result.qconfig = layer.qconfig
    return result


def _group_size(group: Optional[object]) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    group = group if group is not None else dist.group.WORLD
    return dist.get_world_size(group) if dist.get_rank(group) >= 0 else 1


# -- replica rendezvous -------------------------------------------------------------------------------------------
class _Round:
    """One synchronisation of the copies of a layer (the k-th call of the layer in every replica)."""

    def __init__(self, size: int) -> None:
        self.inputs: List[Optional[Tensor]] = [None] * size
        self.outputs: Optional[Tuple[Tensor, ...]] = None
        self.error: Optional[BaseException] = None
        self.taken = 0


class _Rendezvous:
    """Where the copies of one :class:`SyncBatchNorm` meet during one data-parallel forward.

    Created by the master copy's replication callback; every copy registers (``size``). Each call of the layer is
    a round: copies deposit their table line, the last to arrive all-reduces the lines (one differentiable
    :func:`encoding.parallel.allreduce`) and wakes the others, which take their own output.
    """

    def __init__(self) -> None:
        self.size = 0
        self.cond = threading.Condition()
        self.rounds: Dict[int, _Round] = {}

    def exchange(self, call: int, index: int, line: Tensor, failed: Optional[threading.Event],
                 timeout: float) -> Tensor:
        """Deposit ``line`` for round ``call`` as copy ``index``; return the all-reduced table on this copy."""
        with self.cond:
            rnd = self.rounds.setdefault(call, _Round(self.size))
            rnd.inputs[index] = line
            if all(t is not None for t in rnd.inputs):
                try:
                    rnd.outputs = allreduce(1, *rnd.inputs)
                except BaseException as exc:
                    rnd.error = exc
                    raise
                finally:
                    rnd.inputs = [None] * self.size  # drop the references; outputs/error mark the round done
                    self.cond.notify_all()
            else:
                self._wait(rnd, call, index, failed, timeout)
            rnd.taken += 1
            if rnd.taken == self.size:
                del self.rounds[call]
            return rnd.outputs[index]

    def _wait(self, rnd: _Round, call: int, index: int, failed: Optional[threading.Event], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while rnd.outputs is None:
            if rnd.error is not None:
                raise ReplicaAbortedError(f"SyncBatchNorm replica {index}: the replica that all-reduced the "
                                          f"statistics failed ({type(rnd.error).__name__}: {rnd.error})")
            if failed is not None and failed.is_set():
                raise ReplicaAbortedError(f"SyncBatchNorm replica {index}: another replica failed; stopped waiting "
                                          f"at synchronisation #{call}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [i for i, t in enumerate(rnd.inputs) if t is None]
                raise TimeoutError(f"SyncBatchNorm replica {index}: replica(s) {missing} did not reach "
                                   f"synchronisation #{call} of this layer within {timeout:g} s (every replica must "
                                   f"call the layer the same number of times; see SyncBatchNorm.sync_timeout)")
            self.cond.wait(min(_POLL_SECONDS, remaining))
