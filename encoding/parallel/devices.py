"""Device lists: CUDA indices, ``torch.device`` objects and strings (``"cpu"`` may repeat) resolved to
``torch.device``."""
from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Union

import torch
from torch import nn

__all__ = ["DeviceLike", "resolve_device", "resolve_devices", "all_distinct_cuda", "check_module_device"]

DeviceLike = Union[int, str, torch.device]

#: The integer that stands for the CPU where torch (``gather``'s target device) and mmcv accept an index.
CPU_INDEX = -1


def resolve_device(device: DeviceLike) -> torch.device:
    """Turn a CUDA index, a string or a ``torch.device`` into a ``torch.device`` with an explicit CUDA index.

    Args:
        device: e.g. ``0``, ``"cuda:1"``, ``"cpu"``, ``torch.device("cuda")``; ``-1`` is the CPU (the sentinel of
            torch's ``gather`` target device and of mmcv's CPU scatter).

    Returns:
        The ``torch.device`` (``"cuda"`` without index means the current CUDA device; every CPU device is
        ``torch.device("cpu")``).

    Raises:
        ValueError: for a negative index other than ``-1``, a CUDA device that does not exist, or an unparsable
            value.
    """
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise ValueError(f"device_ids entries must be CUDA indices, strings or torch.device, got {device!r}")
    if isinstance(device, int):
        if device < CPU_INDEX:
            raise ValueError(f"device_ids contains a negative CUDA index: {device} (only -1, the CPU, is allowed)")
        device = torch.device("cpu") if device == CPU_INDEX else torch.device("cuda", device)
    else:
        try:
            device = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"device_ids contains an invalid device {device!r}: {exc}") from None
    if device.type == "cpu":  # "cpu:0" too: CPU tensors report no index, so a module there could not match it
        return torch.device("cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device_ids contains {device} but CUDA is not available on this machine; "
                             "use [] or ['cpu', ...] instead")
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ValueError(f"device_ids contains {device} but only {torch.cuda.device_count()} CUDA device(s) exist")
        device = torch.device("cuda", index)
    return device


def resolve_devices(device_ids: Optional[Iterable[DeviceLike]]) -> List[torch.device]:
    """Resolve a ``device_ids`` argument.

    Args:
        device_ids: ``None`` (all CUDA devices, or ``[]`` on a CPU-only machine) or an iterable of device-likes.
            Repeats are allowed (``["cpu"] * 3`` = three CPU replicas).

    Returns:
        A list of ``torch.device``.
    """
    if device_ids is None:
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    if isinstance(device_ids, (int, str, torch.device)):
        raise ValueError(f"device_ids must be a list of devices, got the single value {device_ids!r}; "
                         f"write [{device_ids!r}]")
    return [resolve_device(d) for d in device_ids]


def all_distinct_cuda(devices: Sequence[torch.device]) -> bool:
    """True when every device is a CUDA device and none repeats (torch's coalesced comm primitives apply)."""
    return bool(devices) and all(d.type == "cuda" for d in devices) and len(set(devices)) == len(devices)


def check_module_device(module: nn.Module, device: torch.device) -> None:
    """Raise a clear error unless every parameter and buffer of ``module`` lives on ``device``.

    Raises:
        RuntimeError: naming the first offending tensor and its device.
    """
    for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for name, tensor in named:
            if tensor.device != device:
                raise RuntimeError(
                    f"module must have its parameters and buffers on device {device} (device_ids[0]) but {kind} "
                    f"'{name}' is on {tensor.device}; call module.to({str(device)!r}) before wrapping")
