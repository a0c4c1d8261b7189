"""PyTorch-Encoding's training helpers: ``MixUpWrapper`` and ``get_selabel_vector`` (its ``utils/train_helper.py``)
and ``torch_dist_sum`` (its ``utils/dist_helper.py``).

``get_selabel_vector`` is the SE-loss target of the core loss (``encoding.nn.loss``'s class presence);
``torch_dist_sum`` is :func:`~encoding.utils.dist.reduce_across_processes` on PE's call. Each is declared in
``encoding.utils`` (PE exported them there) beside its definition.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..nn.loss.cross_entropy import class_presence
from ..utils.dist import reduce_across_processes
from .declare import old_name

__all__ = ["MixUpWrapper", "get_selabel_vector", "torch_dist_sum"]

DeviceLike = Union[int, str, torch.device, None]


def _device(device: DeviceLike) -> torch.device:
    """PE's ``gpu`` argument as a device: an int is a CUDA index (PE's ``.cuda(gpu)``), ``None`` the CPU."""
    if device is None:
        return torch.device("cpu")
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


@old_name("encoding.utils")
def get_selabel_vector(target: Tensor, nclass: int) -> Tensor:
    """PyTorch-Encoding's SE-loss target: which classes occur in each image.

    Args:
        target: integer labels ``B x H x W``; values outside ``[0, nclass)`` (``-1``, ``255``, ...) are not classes.
        nclass: number of classes.

    Returns:
        ``B x nclass`` ``float32`` tensor on the CPU (as PE's): 1 where the class occurs in the image, else 0 -- the
        target :class:`~encoding.nn.SegmentationLosses` builds for its SE term.
    """
    target = target.detach().long()
    valid = (target >= 0) & (target < nclass)
    return class_presence(target, valid, int(nclass)).float().cpu()


@old_name("encoding.utils")
def torch_dist_sum(gpu: DeviceLike, *args: Any) -> List[Tensor]:
    """Sum tensors or numbers over every process (PyTorch-Encoding's ``torch_dist_sum``).

    Args:
        gpu: where the results live: a CUDA index (PE's argument), a device or device string (``"cpu"`` with
            gloo), or ``None`` for the CPU.
        *args: tensors (any shape; not modified) or numbers (ints, floats, numpy arrays).

    Returns:
        One flattened (1-D) tensor per argument on ``gpu``: its sum over the processes of the default group. Without
        an initialised process group (PE raised) the sum is over this process alone: copies of the values.
    """
    device = _device(gpu)
    flat = [(arg.detach() if isinstance(arg, Tensor) else torch.as_tensor(arg)).reshape(-1).to(device)
            for arg in args]
    return [reduce_across_processes(value, "sum") for value in flat]


@old_name("encoding.utils")
class MixUpWrapper:
    """A data loader that yields mixup batches (PyTorch-Encoding's ``MixUpWrapper``, classification training).

    Each batch ``(input, target)`` of ``dataloader`` is moved to ``device``, the target one-hot encoded
    (``num_classes``), and with ``c ~ Beta(alpha, alpha)`` (numpy's global generator, as PE) and a random
    permutation ``p`` of the batch (torch's global generator) it yields ``(c * input + (1 - c) * input[p],
    c * onehot + (1 - c) * onehot[p])``, the target in the default float dtype. ``len()`` is the loader's.

    Args:
        alpha: the Beta distribution's parameter (> 0).
        num_classes: number of classes of the one-hot target.
        dataloader: any iterable of ``(input, target)`` batches with ``len``.
        device: a CUDA index (PE's ``args.gpu``), a device or device string, or ``None`` for the CPU.

    Example:
        >>> loader = MixUpWrapper(0.2, 1000, train_loader, args.gpu)  # doctest: +SKIP
        >>> criterion = NLLMultiLabelSmooth(0.1)  # takes the soft targets  # doctest: +SKIP
    """

    def __init__(self, alpha: float, num_classes: int, dataloader: Iterable, device: DeviceLike) -> None:
        if not alpha > 0:
            raise ValueError(f"MixUpWrapper: alpha must be > 0, got {alpha}")
        self.alpha = alpha
        self.num_classes = num_classes
        self.dataloader = dataloader
        self.device = device

    def mixup(self, data: Tensor, target: Tensor) -> Tuple[Tensor, Tensor]:
        """One mixed batch from a batch on the device and its integer ``target``."""
        with torch.no_grad():
            onehot = F.one_hot(target.long(), self.num_classes).to(torch.get_default_dtype())
            c = float(np.random.beta(self.alpha, self.alpha))
            perm = torch.randperm(data.size(0)).to(data.device)
            return c * data + (1 - c) * data[perm], c * onehot + (1 - c) * onehot[perm]

    def mixup_loader(self, loader: Optional[Iterable] = None) -> Iterator[Tuple[Tensor, Tensor]]:
        """The mixed batches of ``loader`` (default: the wrapped one)."""
        device = _device(self.device)
        for data, target in self.dataloader if loader is None else loader:
            yield self.mixup(data.to(device), target.to(device))

    def __len__(self) -> int:
        return len(self.dataloader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Tuple[Tensor, Tensor]]:
        return self.mixup_loader(self.dataloader)
