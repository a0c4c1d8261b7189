"""encoding.parallel: data parallelism with ungathered outputs and exact loss reduction, on any devices.

``DataParallelModel`` returns one output per replica, each on its own device; ``DataParallelCriterion`` computes the
loss where each output lives and reduces it exactly (the whole-batch value). Device lists accept CUDA indices,
``torch.device``s and strings, including repeated ``"cpu"``, so the multi-replica path runs without GPUs.
See ``docs/parallel.md``.
"""
from .comm import AllReduce, allreduce, broadcast
from .compat import is_module_wrapper
from .data_parallel import (DataParallelCriterion, DataParallelModel, DataParallelWithCallback, ReplicaOutputs,
                            data_parallel)
from .devices import resolve_device, resolve_devices
from .parallel_apply import ReplicaAbortedError, ReplicaContext, get_replica_context, parallel_apply
from .reduction import LossTerm, criterion_loss_terms, cross_entropy_terms, reduce_loss_terms
from .replicate import CallbackContext, execute_replication_callbacks, patch_replication_callback, replicate
from .scatter_gather import batch_size_of, gather, get_split_sizes, scatter, scatter_kwargs, to_device
from .structures import PerSample

__all__ = [
    "DataParallelModel", "DataParallelCriterion", "data_parallel", "ReplicaOutputs",
    "scatter", "scatter_kwargs", "gather", "to_device", "replicate", "parallel_apply", "get_split_sizes", "batch_size_of",
    "PerSample", "CallbackContext", "execute_replication_callbacks", "patch_replication_callback",
    "DataParallelWithCallback", "allreduce", "AllReduce", "broadcast",
    "ReplicaContext", "ReplicaAbortedError", "get_replica_context",
    "LossTerm", "reduce_loss_terms", "criterion_loss_terms", "cross_entropy_terms",
    "resolve_device", "resolve_devices", "is_module_wrapper",
]
