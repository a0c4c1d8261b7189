"""The optimizers ``--optimizer`` names, in one place: training's
(:func:`encoding.engine.builders.build_optimizer`) and the memory planner's simulated step
(:func:`encoding.memory.optimizers.optimizer_factory`) make theirs here, so that what is planned is what trains."""
from __future__ import annotations

from typing import Any, Dict, Tuple, Type

import torch

__all__ = ["OPTIMIZERS", "optimizer_settings"]

#: ``--optimizer``'s names: PyTorch-Encoding's SGD (momentum, weight decay) and AdamW.
OPTIMIZERS = ("sgd", "adamw")


def optimizer_settings(kind: str, *, lr: float, momentum: float = 0.9,
                       weight_decay: float = 1e-4) -> Tuple[Type[torch.optim.Optimizer], Dict[str, Any]]:
    """The torch optimizer class of ``kind`` and its keyword arguments.

    Args:
        kind: ``"sgd"`` (PyTorch-Encoding's: SGD with ``momentum``) or ``"adamw"`` (``momentum`` is unused).
        lr: the learning rate.
        momentum: SGD's momentum (``0``: SGD holds no state).
        weight_decay: L2 (SGD) or decoupled (AdamW) weight decay.

    Returns:
        ``(cls, kwargs)``: ``cls(params, **kwargs)`` is the optimizer (``ZeroRedundancyOptimizer`` takes them as
        ``optimizer_class`` and its keywords).

    Raises:
        ValueError: an unknown ``kind``, naming the valid ones.
    """
    if kind not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {kind!r}; valid: {', '.join(OPTIMIZERS)}")
    if kind == "sgd":
        return torch.optim.SGD, dict(lr=lr, momentum=momentum, weight_decay=weight_decay)
    return torch.optim.AdamW, dict(lr=lr, weight_decay=weight_decay)
