"""Per-iteration learning-rate schedules of PyTorch-Encoding, also usable as a ``torch.optim.lr_scheduler``.

With ``T`` the global iteration (``epoch * iters_per_epoch + i``), ``W = warmup_epochs * iters_per_epoch`` and
``N = (num_epochs - warmup_epochs) * iters_per_epoch``:

* warm-up (``T < W``): ``lr = base_lr * T / W`` (linear from 0, as in PE);
* ``poly``: ``lr = base_lr * (1 - (T - W) / N) ** 0.9``;
* ``cos``:  ``lr = base_lr * 0.5 * (1 + cos(pi * (T - W) / N))``;
* ``step``: ``lr = base_lr * 0.1 ** (epoch // lr_step)``.

``T - W`` is clamped to ``N``, so iterating past the end keeps ``lr`` at its final value (0 for poly/cos).

Head multiplier (PE convention): parameter group 0 (the pretrained backbone) gets ``lr`` and every later group
(the new heads) gets ``head_multiplier * lr`` (10 by default). A group with an ``"lr_mult"`` entry uses that factor
instead. Pass ``head_multiplier=1`` for one rate everywhere.

Two ways to drive it:

* PE style: ``scheduler(optimizer, i, epoch, best_pred)`` at every iteration;
* torch style: ``LR_Scheduler(..., optimizer=opt)`` sets the rate of iteration 0 right away, then ``scheduler.step()``
  after each ``optimizer.step()``. ``state_dict()``/``load_state_dict()`` resume either way; ``last_epoch`` counts
  *iterations* (the last ``T`` applied).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Dict, List, Optional

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["LR_Scheduler", "LR_Scheduler_Head"]

_MODES = ("poly", "cos", "step")
_logger = logging.getLogger(__name__)


class LR_Scheduler(LRScheduler):  # noqa: N801 - PyTorch-Encoding name
    """Poly / cosine / step learning rate with linear warm-up, per iteration.

    Args:
        mode: ``"poly"``, ``"cos"`` or ``"step"``.
        base_lr: learning rate of group 0 after warm-up.
        num_epochs: total number of epochs (warm-up included).
        iters_per_epoch: iterations per epoch (``len(train_loader)``).
        lr_step: epochs between two ×0.1 decays (``step`` mode only; required there).
        warmup_epochs: epochs of linear warm-up from 0.
        optimizer: attach an optimizer to use the scheduler torch-style (``step()``); optional for PE style.
        head_multiplier: factor of parameter groups after the first (PE heads: 10).
        power: exponent of the poly schedule.

    Example:
        >>> opt = torch.optim.SGD([{"params": backbone}, {"params": head}], lr=0.01)  # doctest: +SKIP
        >>> sched = LR_Scheduler("poly", 0.01, num_epochs=50, iters_per_epoch=len(loader))  # doctest: +SKIP
        >>> for epoch in range(50):  # doctest: +SKIP
        ...     for i, batch in enumerate(loader):
        ...         sched(opt, i, epoch, best_pred)      # backbone 0.01 * f(T), head 0.1 * f(T)
    """

    def __init__(self, mode: str, base_lr: float, num_epochs: int, iters_per_epoch: int, lr_step: int = 0,
                 warmup_epochs: int = 0, *, optimizer: Optional[Optimizer] = None, head_multiplier: float = 10.0,
                 power: float = 0.9) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if base_lr < 0:
            raise ValueError(f"base_lr must be >= 0, got {base_lr}")
        if iters_per_epoch < 1:
            raise ValueError(f"iters_per_epoch must be >= 1, got {iters_per_epoch}")
        if not 0 <= warmup_epochs < num_epochs:
            raise ValueError(f"need 0 <= warmup_epochs < num_epochs, got warmup_epochs={warmup_epochs}, "
                             f"num_epochs={num_epochs}")
        if mode == "step" and lr_step < 1:
            raise ValueError(f"mode 'step' needs lr_step >= 1 (epochs between decays), got {lr_step}")
        self.mode = mode
        self.base_lr = float(base_lr)
        self.num_epochs = int(num_epochs)
        self.iters_per_epoch = int(iters_per_epoch)
        self.lr_step = int(lr_step)
        self.warmup_epochs = int(warmup_epochs)
        self.head_multiplier = float(head_multiplier)
        self.power = float(power)
        self.warmup_iters = self.warmup_epochs * self.iters_per_epoch
        self.total_iters = (self.num_epochs - self.warmup_epochs) * self.iters_per_epoch
        self.epoch = -1  # last epoch announced in the log (PE attribute)
        self.last_epoch = -1  # last iteration T applied (torch attribute name)
        self._step_count = 0
        self._last_lr: List[float] = []
        self.base_lrs: List[float] = []
        self.optimizer = optimizer
        if optimizer is not None:
            if not isinstance(optimizer, Optimizer):
                raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
            self.base_lrs = [self.base_lr * self._multiplier(g, k) for k, g in enumerate(optimizer.param_groups)]
            self.step()

    # -- the schedule --------------------------------------------------------------------------------------------
    def lr_at(self, T: int) -> float:  # noqa: N803 - PE notation
        """Learning rate of parameter group 0 at global iteration ``T`` (``T >= 0``)."""
        if T < 0:
            raise ValueError(f"iteration must be >= 0, got {T}")
        if T < self.warmup_iters:
            return self.base_lr * T / self.warmup_iters
        t = min(T - self.warmup_iters, self.total_iters)
        if self.mode == "poly":
            return self.base_lr * (1.0 - t / self.total_iters) ** self.power
        if self.mode == "cos":
            return 0.5 * self.base_lr * (1.0 + math.cos(math.pi * t / self.total_iters))
        return self.base_lr * 0.1 ** ((T // self.iters_per_epoch) // self.lr_step)

    def _multiplier(self, group: Dict[str, Any], index: int) -> float:
        if "lr_mult" in group:
            return float(group["lr_mult"])
        return 1.0 if index == 0 else self.head_multiplier

    def _apply(self, optimizer: Optimizer, T: int) -> float:  # noqa: N803
        lr = self.lr_at(T)
        for index, group in enumerate(optimizer.param_groups):
            group["lr"] = lr * self._multiplier(group, index)
        self.last_epoch = T
        self._last_lr = [group["lr"] for group in optimizer.param_groups]
        return lr

    # -- PyTorch-Encoding interface ------------------------------------------------------------------------------
    def __call__(self, optimizer: Optimizer, i: int, epoch: int, best_pred: Optional[float] = None) -> float:
        """Set the rates for iteration ``i`` of ``epoch`` (PE style) and return group 0's rate."""
        lr = self._apply(optimizer, epoch * self.iters_per_epoch + i)
        if epoch > self.epoch:
            best = "" if best_pred is None else f", previous best = {best_pred:.4f}"
            _logger.info("Epoch %d, learning rate = %.6g%s", epoch, lr, best)
            self.epoch = epoch
        return lr

    # -- torch.optim.lr_scheduler interface ----------------------------------------------------------------------
    def step(self, epoch: Optional[int] = None) -> None:  # type: ignore[override]
        """Advance one iteration on the attached optimizer (call after ``optimizer.step()``)."""
        if epoch is not None:
            raise ValueError("LR_Scheduler.step() takes no epoch; use scheduler(optimizer, i, epoch) to jump")
        if self.optimizer is None:
            raise RuntimeError("no optimizer attached: pass optimizer= to LR_Scheduler, or call "
                               "scheduler(optimizer, i, epoch, best_pred) PyTorch-Encoding style")
        self._step_count += 1
        self._apply(self.optimizer, self.last_epoch + 1)

    def get_lr(self) -> List[float]:
        """Rates of the attached optimizer's groups at the current iteration."""
        if self.optimizer is None:
            raise RuntimeError("no optimizer attached")
        T = max(self.last_epoch, 0)  # noqa: N806
        return [self.lr_at(T) * self._multiplier(g, k) for k, g in enumerate(self.optimizer.param_groups)]

    def get_last_lr(self) -> List[float]:
        """Rates set by the last call (one per parameter group)."""
        return list(self._last_lr)

    def state_dict(self) -> Dict[str, Any]:
        """Everything but the optimizer (plain numbers and strings: safe for ``weights_only`` loading)."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (schedule settings and position)."""
        unknown = set(state_dict) - set(self.state_dict())
        if unknown:
            raise KeyError(f"not an LR_Scheduler state dict: unexpected keys {sorted(unknown)}")
        self.__dict__.update(state_dict)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(mode={self.mode!r}, base_lr={self.base_lr}, num_epochs={self.num_epochs}, "
                f"iters_per_epoch={self.iters_per_epoch}, lr_step={self.lr_step}, "
                f"warmup_epochs={self.warmup_epochs}, head_multiplier={self.head_multiplier})")


#: PyTorch-Encoding's name for the scheduler with 10x head groups (our :class:`LR_Scheduler` already does that).
LR_Scheduler_Head = LR_Scheduler
