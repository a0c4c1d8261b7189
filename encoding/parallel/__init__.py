"""encoding.parallel: data parallelism with ungathered outputs and exact loss reduction, on any devices.

``DataParallelModel`` returns one output per replica, each on its own device; ``DataParallelCriterion`` computes the
loss where each output lives and reduces it exactly (the whole-batch value). Device lists accept CUDA indices,
``torch.device`` objects and strings, including repeated ``"cpu"``, so the multi-replica path runs without GPUs.
See ``docs/parallel.md``.
"""
from .comm import AllReduce, allreduce, broadcast
from .criterion import DataParallelCriterion
from .data_parallel import DataParallelModel, DataParallelWithCallback, ReplicaOutputs, data_parallel
from .devices import resolve_devices
from .parallel_apply import ReplicaAbortedError, ReplicaContext, get_replica_context, parallel_apply
from .reduction import LossTerm, reduce_loss_terms
from .replicate import CallbackContext, execute_replication_callbacks, patch_replication_callback, replicate
from .scatter_gather import gather, scatter
from .structures import PerSample

# What users call (19 names); helpers such as ``CallbackContext`` / ``execute_replication_callbacks``
# (``replicate``), ``ReplicaAbortedError`` (``parallel_apply``), ``scatter_gather.get_split_sizes`` /
# ``scatter_kwargs`` / ``to_device``, ``reduction.criterion_loss_terms`` and ``devices.resolve_device`` stay in their
# submodules; the memory planner is :mod:`encoding.memory`.
__all__ = [
    "DataParallelModel", "DataParallelCriterion", "DataParallelWithCallback", "ReplicaOutputs", "data_parallel",
    "scatter", "gather", "replicate", "parallel_apply", "broadcast", "allreduce", "AllReduce",
    "PerSample", "LossTerm", "reduce_loss_terms", "patch_replication_callback",
    "ReplicaContext", "get_replica_context", "resolve_devices",
]
