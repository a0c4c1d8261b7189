"""``DataParallelModel`` (ungathered outputs) and ``DataParallelCriterion`` (exact per-device loss reduction)."""
from __future__ import annotations

import itertools

from typing import Any, Callable, List, Optional, Sequence

import torch
from torch import nn

from .devices import DeviceLike, check_module_device, resolve_device, resolve_devices
from .parallel_apply import parallel_apply
from .reduction import criterion_loss_terms, reduce_loss_terms
from .replicate import replicate
from .scatter_gather import batch_size_of, gather, scatter_kwargs, to_device
from .structures import device_of

__all__ = ["ReplicaOutputs", "DataParallelModel", "DataParallelCriterion", "data_parallel"]


class ReplicaOutputs(list):
    """The ungathered outputs of :class:`DataParallelModel`: a ``list`` with one output per replica that ran.

    Attributes:
        split_sizes: how many samples each replica processed (``None`` entries when nothing was split).
        devices: the replica devices, in order.
        dim: the batch dimension used for the split.
    """

    def __init__(self, outputs: Sequence[Any], split_sizes: Sequence[Optional[int]],
                 devices: Sequence[torch.device], dim: int = 0):
        super().__init__(outputs)
        self.split_sizes = list(split_sizes)
        self.devices = list(devices)
        self.dim = dim


class _DataParallelBase(nn.Module):
    """Device bookkeeping shared by the model and criterion wrappers."""

    def __init__(self, device_ids: Optional[Sequence[DeviceLike]], output_device: Optional[DeviceLike], dim: int):
        super().__init__()
        self.device_ids: List[torch.device] = resolve_devices(device_ids)
        if output_device is not None:
            self.output_device: Optional[torch.device] = resolve_device(output_device)
        else:
            self.output_device = self.device_ids[0] if self.device_ids else None
        self.dim = dim

    def extra_repr(self) -> str:
        return f"device_ids={[str(d) for d in self.device_ids]}, output_device={self.output_device}, dim={self.dim}"


class DataParallelModel(_DataParallelBase):
    """Data parallelism that returns the **ungathered** per-device outputs.

    The batch is split along ``dim`` over ``device_ids`` (balanced sizes, see
    :func:`~encoding.parallel.get_split_sizes`), the module is replicated, replicas run concurrently, and their
    outputs are returned as a list, each on its own device. Compute the loss there with
    :class:`DataParallelCriterion` so that no device has to hold every replica's output (plain
    ``nn.DataParallel`` gathers everything onto device 0, which runs out of memory first). Backward sums the
    replicas' gradients into the wrapped module's parameters.

    ``device_ids`` may hold CUDA indices, ``torch.device``s or strings, and may repeat ``"cpu"`` (three CPU
    replicas run the same code path as three GPUs, which is how the tests run without GPUs). With ``[]`` (the default
    on a CPU-only machine) or a single device the module is called directly; the return value is still a one-element
    list.

    Args:
        module: the module; its parameters and buffers must live on ``device_ids[0]``.
        device_ids: devices to use (default: all CUDA devices, or ``[]`` without CUDA).
        output_device: kept for API compatibility (used by :meth:`gather`; default ``device_ids[0]``).
        dim: the batch dimension of inputs and outputs.

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
    """

    def __init__(self, module: nn.Module, device_ids: Optional[Sequence[DeviceLike]] = None,
                 output_device: Optional[DeviceLike] = None, dim: int = 0):
        super().__init__(device_ids, output_device, dim)
        self.module = module

    def forward(self, *inputs: Any, **kwargs: Any) -> ReplicaOutputs:
        return self._run(None, inputs, kwargs)

    def train_step(self, *inputs: Any, **kwargs: Any) -> ReplicaOutputs:
        """Call the wrapped module's ``train_step`` through the same scatter/replicate path (mmcv style)."""
        return self._run("train_step", inputs, kwargs)

    def val_step(self, *inputs: Any, **kwargs: Any) -> ReplicaOutputs:
        """Call the wrapped module's ``val_step`` through the same scatter/replicate path (mmcv style)."""
        return self._run("val_step", inputs, kwargs)

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

    def _run(self, method: Optional[str], inputs: tuple, kwargs: dict) -> ReplicaOutputs:
        if len(self.device_ids) <= 1:  # like torch: call the module directly, nothing to split or check
            return self._run_direct(method, inputs, kwargs)
        check_module_device(self.module, self.device_ids[0])
        inputs_per_replica, kwargs_per_replica, sizes = scatter_kwargs(inputs, kwargs, self.device_ids, self.dim)
        devices = self.device_ids[:len(sizes)]
        if len(devices) == 1:
            output = self._method(self.module, method)(*inputs_per_replica[0], **kwargs_per_replica[0])
            return ReplicaOutputs([output], sizes, devices, self.dim)
        replicas = replicate(self.module, devices)
        outputs = parallel_apply([self._method(r, method) for r in replicas], inputs_per_replica,
                                 kwargs_per_replica, devices)
        return ReplicaOutputs(outputs, sizes, devices, self.dim)

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


class DataParallelCriterion(_DataParallelBase):
    """Compute a loss on every device from :class:`DataParallelModel`'s ungathered outputs and reduce it exactly.

    ``forward(outputs, *targets, **kwargs)`` splits the targets with **exactly the split sizes the model used**
    (from :class:`ReplicaOutputs`, or from each output's size along ``dim``), moves each part to its output's
    device, evaluates the criterion there (in parallel), and combines the results with the exact-reduction protocol
    (:mod:`encoding.parallel.reduction`): the result equals the criterion on the whole batch, also for uneven splits
    and uneven ``ignore_index`` masks. PyTorch-Encoding's unweighted mean of per-device losses is biased; this is not.

    The criterion receives ``(output_i, *targets_i, **kwargs_i)``, where ``output_i`` is whatever the model returned
    (tensor, tuple, dict). A criterion that returns a non-scalar (``reduction='none'``) is gathered along ``dim``.

    Args:
        criterion: an ``nn.Module`` (replicated per device, so buffers such as class weights follow) or a callable.
        device_ids: as for :class:`DataParallelModel` (only consulted when an output holds no tensor).
        output_device: where the reduced loss lives (default: ``device_ids[0]``, else the first output's device).
        dim: the batch dimension.

    Example:
        >>> model = DataParallelModel(nn.Linear(4, 3), device_ids=["cpu"] * 3)
        >>> criterion = DataParallelCriterion(nn.CrossEntropyLoss(), device_ids=["cpu"] * 3)
        >>> loss = criterion(model(torch.randn(7, 4)), torch.randint(0, 3, (7,)))
        >>> loss.dim()
        0
    """

    def __init__(self, criterion: Callable[..., Any], device_ids: Optional[Sequence[DeviceLike]] = None,
                 output_device: Optional[DeviceLike] = None, dim: int = 0):
        super().__init__(device_ids, output_device, dim)
        self.criterion = criterion

    @property
    def module(self) -> Callable[..., Any]:
        """The wrapped criterion (PyTorch-Encoding name)."""
        return self.criterion

    def forward(self, outputs: Any, *targets: Any, **kwargs: Any) -> Any:
        outputs = outputs if isinstance(outputs, list) else [outputs]
        if not outputs:
            raise ValueError("DataParallelCriterion got an empty list of outputs")
        if len(outputs) == 1:
            targets, kwargs = to_device((targets, kwargs), self._replica_device(outputs[0], 0))
            return self.criterion(outputs[0], *targets, **kwargs)
        sizes = self._split_sizes(outputs)
        devices = [self._replica_device(o, i) for i, o in enumerate(outputs)]
        target_parts, kw_parts, _ = scatter_kwargs(targets, kwargs, devices, self.dim, split_sizes=sizes)
        criteria = self._replicate_criterion(devices)
        calls = [_TermsCall(c, s) for c, s in zip(criteria, sizes)]
        results = parallel_apply(calls, [(o,) + tuple(t) for o, t in zip(outputs, target_parts)], kw_parts, devices)
        output_device = self.output_device if self.output_device is not None else devices[0]
        if all(isinstance(r, list) for r in results):
            return reduce_loss_terms(results, output_device)
        return gather(results, output_device, self.dim)

    def _replica_device(self, output: Any, index: int) -> torch.device:
        device = device_of(output)
        if device is not None:
            return device
        if index < len(self.device_ids):
            return self.device_ids[index]
        raise ValueError(f"output {index} holds no tensor and device_ids has no entry {index}")

    def _split_sizes(self, outputs: Sequence[Any]) -> List[int]:
        sizes = getattr(outputs, "split_sizes", None)
        if sizes is not None and None not in sizes:
            return list(sizes)
        inferred = [batch_size_of(o, self.dim, name=f"outputs[{i}]") for i, o in enumerate(outputs)]
        if None in inferred:
            raise ValueError("DataParallelCriterion cannot tell how many samples each output holds: pass the "
                             "ReplicaOutputs that DataParallelModel returned, or outputs with a batch dimension")
        return inferred

    def _replicate_criterion(self, devices: List[torch.device]) -> List[Callable[..., Any]]:
        criterion = self.criterion
        if isinstance(criterion, nn.Module) and next(itertools.chain(criterion.parameters(), criterion.buffers()),
                                                     None) is not None:
            return replicate(criterion, devices)
        return [criterion] * len(devices)


class _TermsCall:
    """Evaluate one replica's criterion as loss terms (see :func:`criterion_loss_terms`)."""

    def __init__(self, criterion: Callable[..., Any], batch_size: int):
        self.criterion = criterion
        self.batch_size = batch_size

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return criterion_loss_terms(self.criterion, args, kwargs, self.batch_size)


def data_parallel(module: nn.Module, inputs: Any, device_ids: Optional[Sequence[DeviceLike]] = None,
                  output_device: Optional[DeviceLike] = None, dim: int = 0,
                  module_kwargs: Optional[dict] = None) -> Any:
    """Functional data parallelism that gathers the outputs (like ``torch.nn.parallel.data_parallel``).

    Args:
        module: the module to run.
        inputs: the positional input(s); a non-tuple is the single argument.
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
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    wrapper = DataParallelModel(module, device_ids, output_device, dim)
    outputs = wrapper(*inputs, **(module_kwargs or {}))
    return gather(outputs, wrapper.output_device, dim)
