"""``DataParallelModel`` (ungathered outputs), ``DataParallelWithCallback`` (gathered) and ``data_parallel``; the
criterion wrapper is :mod:`encoding.parallel.criterion`."""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .devices import DeviceLike, check_module_device, resolve_device, resolve_devices
from .parallel_apply import parallel_apply
from .planners import check_chunk_sizes, make_balancer
from .replicate import execute_replication_callbacks, replicate
from .scatter_gather import batch_size_of, gather, get_split_sizes, scatter_kwargs, to_device
from .structures import PerSample, device_of, iter_leaves

__all__ = ["ReplicaOutputs", "DataParallelModel", "DataParallelWithCallback", "data_parallel"]


class ReplicaOutputs(list):
    """The ungathered outputs of :class:`DataParallelModel`: a ``list`` with one output per replica that ran.

    Attributes:
        split_sizes: how many samples each replica processed (``None`` entries when nothing was split).
        devices: the replica devices, in order.
        dim: the batch dimension used for the split.
        sample_lists: the call's inputs held lists of samples (scattered per sample): a list output that reads both
            as samples and as batched tensors is then refused by :func:`~encoding.parallel.gather`.
    """

    def __init__(self, outputs: Sequence[Any], split_sizes: Sequence[Optional[int]],
                 devices: Sequence[torch.device], dim: int = 0, sample_lists: bool = False):
        super().__init__(outputs)
        self.split_sizes = list(split_sizes)
        self.devices = list(devices)
        self.dim = dim
        self.sample_lists = sample_lists


class _DataParallelBase(nn.Module):
    """Device bookkeeping shared by the model and criterion wrappers.

    ``nn.Module.__init__`` is called directly: ``torch.nn.DataParallel.__init__`` (a base of
    :class:`DataParallelModel`) would reset ``device_ids`` to ``[]`` on a machine without CUDA.
    """

    def __init__(self, device_ids: Optional[Sequence[DeviceLike]], output_device: Optional[DeviceLike], dim: int):
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise TypeError(f"{type(self).__name__}: dim must be an int (the batch dimension), got {dim!r}")
        nn.Module.__init__(self)
        self.device_ids: List[torch.device] = resolve_devices(device_ids)
        if output_device is not None:
            self.output_device: Optional[torch.device] = resolve_device(output_device)
        else:
            self.output_device = self.device_ids[0] if self.device_ids else None
        self.dim = dim

    def extra_repr(self) -> str:
        return f"device_ids={[str(d) for d in self.device_ids]}, output_device={self.output_device}, dim={self.dim}"


class DataParallelModel(_DataParallelBase, nn.DataParallel):
    """Data parallelism that returns the **ungathered** per-device outputs.

    The batch is split along ``dim`` over ``device_ids`` (balanced sizes, see
    :func:`~encoding.parallel.scatter_gather.get_split_sizes`), the module is replicated, replicas run concurrently, and their
    outputs are returned as a list, each on its own device. Compute the loss there with
    :class:`DataParallelCriterion` so that no device has to hold every replica's output (plain
    ``nn.DataParallel`` gathers everything onto device 0, which runs out of memory first). Backward sums the
    replicas' gradients into the wrapped module's parameters.

    ``device_ids`` may hold CUDA indices, ``torch.device`` objects or strings, and may repeat ``"cpu"`` (three CPU
    replicas run the same code path as three GPUs, which is how the tests run without GPUs). With ``[]`` (the default
    on a CPU-only machine) or a single device the module is called directly; the return value is still a one-element
    list.

    Args:
        module: the module; its parameters and buffers must live on ``device_ids[0]``.
        device_ids: devices to use (default: all CUDA devices, or ``[]`` without CUDA).
        output_device: kept for API compatibility (used by :meth:`gather`; default ``device_ids[0]``).
        dim: the batch dimension of inputs and outputs.
        chunk_sizes: explicit samples per device (one entry per device, ``0`` = the device sits this batch out;
            the argument of torch's C++ ``Scatter``), e.g. ``[1, 3, 3]`` to unload device 0. Every batch must then
            have ``sum(chunk_sizes)`` samples. Settable later as the ``chunk_sizes`` attribute.
        balance: ``"memory"`` (or a :class:`~encoding.memory.MemoryBalancer`) picks, per batch size, the integer
            split that minimises the heaviest device's simulated peak memory of a training step (see
            ``docs/memory.md``; the name is registered by :mod:`encoding.memory`, see
            :mod:`encoding.parallel.planners`); ``None`` (default) splits evenly
            (:func:`~encoding.parallel.scatter_gather.get_split_sizes`).

    It is a ``torch.nn.DataParallel`` (``model.module``, ``"module."`` state-dict keys, wrapper checks), with
    ``device_ids`` kept as ``torch.device`` objects and torch's four steps as methods a subclass may override:
    :meth:`scatter`, :meth:`replicate` (replication callbacks included), :meth:`parallel_apply` and :meth:`gather`
    (which ``forward`` does not call: the outputs stay where they were computed).

    Returns (forward):
        A :class:`ReplicaOutputs` list with one output per replica that ran (fewer than ``len(device_ids)`` when the
        batch is smaller), in device order.

    Shape:
        - inputs: tensors ``(N, ...)`` along ``dim``; nested tuples/lists/dicts/namedtuples/dataclasses allowed;
          :class:`~encoding.parallel.PerSample` lists are split with the batch; other values go to every replica.
        - output ``i``: the module's output for samples ``sum(split_sizes[:i]) : sum(split_sizes[:i+1])``.

    Example:
        >>> net = DataParallelModel(nn.Linear(4, 2), device_ids=["cpu"] * 3)
        >>> outputs = net(torch.randn(7, 4))
        >>> [o.shape[0] for o in outputs]
        [3, 2, 2]
        >>> net.chunk_sizes = [1, 0, 6]
        >>> net(torch.randn(7, 4)).split_sizes
        [1, 6]
    """

    def __init__(self, module: nn.Module, device_ids: Optional[Sequence[DeviceLike]] = None,
                 output_device: Optional[DeviceLike] = None, dim: int = 0,
                 chunk_sizes: Optional[Sequence[int]] = None, balance: Any = None):
        if not isinstance(module, nn.Module):
            raise TypeError(f"{type(self).__name__}: module must be an nn.Module, got {type(module).__name__}")
        super().__init__(device_ids, output_device, dim)
        self.module = module
        self.chunk_sizes = chunk_sizes
        self.balance = balance

    @property
    def chunk_sizes(self) -> Optional[List[int]]:
        """Samples per device (``None``: even split, or the one ``balance`` plans)."""
        return self._chunk_sizes

    @chunk_sizes.setter
    def chunk_sizes(self, sizes: Optional[Sequence[int]]) -> None:
        self._chunk_sizes = None if sizes is None else check_chunk_sizes(sizes, len(self.device_ids))

    @property
    def balance(self) -> Any:
        """The split planner (``None`` or a :class:`~encoding.memory.MemoryBalancer`)."""
        return self._balance

    @balance.setter
    def balance(self, balance: Any) -> None:
        self._balance = make_balancer(balance)  # a name is looked up in the registry of encoding.parallel.planners

    def forward(self, *inputs: Any, **kwargs: Any) -> ReplicaOutputs:
        return self._run(None, inputs, kwargs)

    def train_step(self, *inputs: Any, **kwargs: Any) -> ReplicaOutputs:
        """Call the wrapped module's ``train_step`` through the same scatter/replicate path (mmcv style)."""
        return self._run("train_step", inputs, kwargs)

    def val_step(self, *inputs: Any, **kwargs: Any) -> ReplicaOutputs:
        """Call the wrapped module's ``val_step`` through the same scatter/replicate path (mmcv style)."""
        return self._run("val_step", inputs, kwargs)

    @property
    def src_device_obj(self) -> Optional[torch.device]:
        """The device holding the module (``device_ids[0]``; ``None`` without devices), as in torch."""
        return self.device_ids[0] if self.device_ids else None

    def scatter(self, inputs: tuple, kwargs: Optional[dict], device_ids: Sequence[DeviceLike],
                split_sizes: Optional[Sequence[int]] = None) -> Tuple[List[tuple], List[dict]]:
        """Split the call's arguments over ``device_ids`` (torch's signature; see :func:`scatter_kwargs`).

        Returns:
            ``(inputs_per_replica, kwargs_per_replica)``.
        """
        inputs_per_replica, kwargs_per_replica, _ = scatter_kwargs(inputs, kwargs, device_ids, self.dim, split_sizes)
        return inputs_per_replica, kwargs_per_replica

    def replicate(self, module: nn.Module, device_ids: Sequence[DeviceLike]) -> List[nn.Module]:
        """Copies of ``module`` for ``device_ids``, replication callbacks called (see :func:`replicate`)."""
        return replicate(module, device_ids)

    def parallel_apply(self, replicas: Sequence[Callable[..., Any]], inputs: Sequence[Any], kwargs: Sequence[dict],
                       devices: Optional[Sequence[DeviceLike]] = None) -> List[Any]:
        """Run the replicas concurrently (see :func:`parallel_apply`); ``devices`` default to ``device_ids``."""
        return parallel_apply(replicas, inputs, kwargs, devices if devices is not None else
                              self.device_ids[:len(replicas)])

    def gather(self, outputs: Sequence[Any], output_device: Optional[DeviceLike] = None) -> Any:
        """Concatenate the per-replica outputs on ``output_device`` (default: this wrapper's)."""
        return gather(outputs, output_device if output_device is not None else self.output_device, self.dim)

    def _method(self, module: nn.Module, method: Optional[str]) -> Callable[..., Any]:
        if method is None:
            return module
        fn = getattr(module, method, None)
        if fn is None:
            raise AttributeError(f"DataParallelModel.{method}: the wrapped {type(self.module).__name__} has no "
                                 f"'{method}' method")
        return fn

    def device_split(self, inputs: tuple, kwargs: dict) -> Optional[List[int]]:
        """Samples per device for this call (one entry per device, zeros allowed), or ``None`` for the even split.

        Raises:
            ValueError: ``chunk_sizes`` and ``balance`` are both set, or ``chunk_sizes`` does not sum to the batch.
        """
        if self.chunk_sizes is not None and self.balance is not None:
            raise ValueError("DataParallelModel: set either chunk_sizes or balance, not both")
        if self.chunk_sizes is None and self.balance is None:
            return None
        batch = batch_size_of((inputs, kwargs), self.dim, name="args")
        if self.chunk_sizes is not None:
            if batch is not None and sum(self.chunk_sizes) != batch:
                raise ValueError(f"chunk_sizes {self.chunk_sizes} sum to {sum(self.chunk_sizes)} but the batch has "
                                 f"{batch} samples")
            return self.chunk_sizes
        if batch is None or len(self.device_ids) <= 1:
            return None
        return self.balance.plan(self.module, inputs, kwargs, self.device_ids, self.dim)

    def _run(self, method: Optional[str], inputs: tuple, kwargs: dict) -> ReplicaOutputs:
        split = self.device_split(inputs, kwargs)
        if len(self.device_ids) <= 1:  # like torch: call the module directly, nothing to split or check
            return self._run_direct(method, inputs, kwargs)
        check_module_device(self.module, self.src_device_obj)
        devices, source_runs = self.device_ids, split is None or split[0] > 0
        if split is not None:  # devices with no sample sit this batch out
            devices = [d for d, n in zip(self.device_ids, split) if n > 0]
            split = [n for n in split if n > 0]
        inputs_per_replica, kwargs_per_replica, sizes = self._scatter(inputs, kwargs, devices, split)
        devices = devices[:len(sizes)]
        if len(devices) == 1 and devices[0] == self.src_device_obj:
            output = self._method(self.module, method)(*inputs_per_replica[0], **kwargs_per_replica[0])
            return ReplicaOutputs([output], sizes, devices, self.dim)
        replicas = self._replicate(devices, source_runs)
        outputs = self.parallel_apply([self._method(r, method) for r in replicas], inputs_per_replica,
                                      kwargs_per_replica, devices)
        if not source_runs:
            _keep_buffers(self.module, replicas[0])
        sample_lists = any(isinstance(leaf, PerSample) for _, leaf in iter_leaves(inputs_per_replica[0]))
        return ReplicaOutputs(outputs, sizes, devices, self.dim, sample_lists)

    def _scatter(self, inputs: tuple, kwargs: dict, devices: List[torch.device], split: Optional[List[int]]
                 ) -> Tuple[List[tuple], List[dict], List[Optional[int]]]:
        """:meth:`scatter` (called with torch's arguments unless a split is planned) and the sizes it used."""
        if split is None:
            batch = batch_size_of((inputs, kwargs), self.dim, name="args")
            sizes = [None] if batch is None else get_split_sizes(batch, len(devices))
            inputs_per_replica, kwargs_per_replica = self.scatter(inputs, kwargs, devices)
        else:
            sizes = split
            inputs_per_replica, kwargs_per_replica = self.scatter(inputs, kwargs, devices, split_sizes=split)
        return inputs_per_replica, kwargs_per_replica, sizes

    def _replicate(self, devices: List[torch.device], source_runs: bool) -> List[nn.Module]:
        """Replicas for ``devices``; when the source device (``device_ids[0]``) sits out, its copy is made (it
        aliases the module) and dropped, and the replication callbacks see only the replicas that run (the first
        of them is the master copy, whose buffers ``_keep_buffers`` copies back)."""
        if source_runs:
            return self.replicate(self.module, devices)
        replicas = replicate(self.module, [self.src_device_obj] + devices, callbacks=False)[1:]
        execute_replication_callbacks(replicas)
        return replicas

    def _run_direct(self, method: Optional[str], inputs: tuple, kwargs: dict) -> ReplicaOutputs:
        if self.device_ids:
            check_module_device(self.module, self.device_ids[0])
            inputs, kwargs = to_device((inputs, kwargs), self.device_ids[0])
        output = self._method(self.module, method)(*inputs, **kwargs)
        try:
            size = batch_size_of((inputs, kwargs), self.dim)
        except ValueError:  # tensors that are not batched: fine when nothing is split
            size = None
        device = self.device_ids[0] if self.device_ids else device_of(output, torch.device("cpu"))
        return ReplicaOutputs([output], [size], [device], self.dim)


@torch.no_grad()
def _keep_buffers(module: nn.Module, replica: nn.Module) -> None:
    """Copy the buffers of ``replica`` (the master copy: running statistics, ``num_batches_tracked``) into
    ``module``'s, as the master copy's own buffers would be when it is the module's copy on the source device."""
    for own, updated in zip(module.buffers(), replica.buffers()):
        if own is not updated:
            own.copy_(updated)


def data_parallel(module: nn.Module, inputs: Any, device_ids: Optional[Sequence[DeviceLike]] = None,
                  output_device: Optional[DeviceLike] = None, dim: int = 0,
                  module_kwargs: Optional[dict] = None) -> Any:
    """Functional data parallelism that gathers the outputs (like ``torch.nn.parallel.data_parallel``).

    Args:
        module: the module to run.
        inputs: the positional input(s); a non-tuple is the single argument and ``None`` means no inputs (as in
            torch).
        device_ids: as for :class:`DataParallelModel`.
        output_device: where the gathered output lives (default ``device_ids[0]``).
        dim: the batch dimension.
        module_kwargs: keyword arguments for the module.

    Returns:
        The gathered output.

    Example:
        >>> data_parallel(nn.Linear(4, 2), torch.randn(5, 4), device_ids=["cpu", "cpu"]).shape
        torch.Size([5, 2])
    """
    if not isinstance(inputs, tuple):
        inputs = () if inputs is None else (inputs,)
    return DataParallelWithCallback(module, device_ids, output_device, dim)(*inputs, **(module_kwargs or {}))


class DataParallelWithCallback(DataParallelModel):
    """A :class:`DataParallelModel` that gathers, like ``torch.nn.DataParallel``: one output on ``output_device``.

    Replicas are made by :func:`replicate`, so replication callbacks run and :class:`~encoding.nn.SyncBatchNorm`
    synchronises, on any device list (``["cpu", "cpu"]`` included). Vacancy's Synchronized-BatchNorm name.

    Example:
        >>> DataParallelWithCallback(nn.Linear(4, 2), ["cpu", "cpu"])(torch.randn(5, 4)).shape
        torch.Size([5, 2])
    """

    def _run(self, method: Optional[str], inputs: tuple, kwargs: dict) -> Any:
        return self.gather(super()._run(method, inputs, kwargs), self.output_device)
