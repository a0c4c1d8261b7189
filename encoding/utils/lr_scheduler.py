"""Per-iteration learning-rate schedule (poly / cos / step with linear warm-up), as a ``torch.optim`` scheduler.

With ``T`` the global iteration (``epoch * iters_per_epoch + i``), ``W = round(warmup_epochs * iters_per_epoch)``
(a warm-up may be a fraction of an epoch, e.g. ``0.5``) and ``N = num_epochs * iters_per_epoch - W``:

* warm-up (``T < W``): ``lr = base_lr * T / W`` (linear from 0, as in PE);
* ``poly``: ``lr = base_lr * (1 - (T - W) / N) ** 0.9``;
* ``cos``:  ``lr = base_lr * 0.5 * (1 + cos(pi * (T - W) / N))``;
* ``step``: ``lr = base_lr * 0.1 ** (epoch // lr_step)``.

``T - W`` is clamped to ``N``, so iterating past the end keeps ``lr`` at its final value (0 for poly/cos). A warm-up
may take the whole run (``warmup_epochs == num_epochs``, e.g. a one-epoch trial of a recipe that warms up for one
epoch): the rate rises to ``base_lr`` and no decay follows.

Head learning-rate factor (PE convention): parameter group 0 (the pretrained backbone) gets ``lr`` and every later
group (the new heads) gets ``head_lr_mult * lr`` (10 by default; ``train.py --head-lr-mult``). A group with an
``"lr_mult"`` entry uses that factor instead. Pass ``head_lr_mult=1`` for one rate everywhere (``head_multiplier``,
its old name, still works with a ``FutureWarning``).

The core convention is torch's: :class:`IterationLR` takes the optimizer, sets the rate of iteration 0 right away,
and ``step()`` after each ``optimizer.step()`` advances one iteration (``last_epoch`` is the last ``T`` applied).
PyTorch-Encoding's ``LR_Scheduler`` (optimizer optional, ``scheduler(optimizer, i, epoch, best_pred)`` at every
iteration) is built on it and declared for this module in ``encoding/legacy/scheduler.py``.
"""
from __future__ import annotations

import logging
import math
import warnings
from typing import Any, Dict, List, Optional

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

__all__ = ["IterationLR"]

_MODES = ("poly", "cos", "step")
#: State-dict keys of earlier versions -> their names now (a checkpoint written before the rename resumes).
_OLD_KEYS = {"head_multiplier": "head_lr_mult"}
#: The logger of the schedule (PyTorch-Encoding-style drivers announce each epoch's rate on it).
logger = logging.getLogger(__name__)


class IterationLR(LRScheduler):
    """Poly / cosine / step learning rate with linear warm-up, stepped once per iteration (torch style).

    Args:
        optimizer: the optimizer whose parameter groups get the rates.
        mode: ``"poly"``, ``"cos"`` or ``"step"``.
        base_lr: learning rate of group 0 after warm-up.
        num_epochs: total number of epochs (warm-up included).
        iters_per_epoch: iterations per epoch (``len(train_loader)``).
        lr_step: epochs between two ×0.1 decays (``step`` mode only; required there).
        warmup_epochs: epochs of linear warm-up from 0 (a fraction of an epoch too, e.g. ``0.5``: the warm-up
            takes ``round(warmup_epochs * iters_per_epoch)`` iterations); at most ``num_epochs``.
        head_lr_mult: factor of parameter groups after the first (PE heads: 10; ``head_multiplier``: its old name).
        power: exponent of the poly schedule.

    Example:
        >>> sched = IterationLR(opt, "poly", 0.01, num_epochs=50, iters_per_epoch=len(loader))  # doctest: +SKIP
        >>> for batch in loader:  # doctest: +SKIP
        ...     loss.backward(); opt.step(); sched.step()
    """

    def __init__(self, optimizer: Optimizer, mode: str, base_lr: float, num_epochs: int, iters_per_epoch: int,
                 lr_step: int = 0, warmup_epochs: float = 0, *, head_lr_mult: float = 10.0,
                 power: float = 0.9, **old: float) -> None:
        self._configure(mode, base_lr, num_epochs, iters_per_epoch, lr_step, warmup_epochs, head_lr_mult, power, **old)
        self._attach(optimizer)

    def _configure(self, mode: str, base_lr: float, num_epochs: int, iters_per_epoch: int, lr_step: int = 0,
                   warmup_epochs: float = 0, head_lr_mult: float = 10.0, power: float = 0.9, **old: float) -> None:
        """Validate and store the schedule; no optimizer yet (``head_multiplier``: the old name of ``head_lr_mult``)."""
        if set(old) - {"head_multiplier"}:
            raise TypeError(f"unexpected keyword argument {sorted(set(old) - {'head_multiplier'})[0]!r}")
        if "head_multiplier" in old:
            warnings.warn("head_multiplier= is now head_lr_mult=", FutureWarning, stacklevel=3)
            head_lr_mult = old["head_multiplier"]
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
        if base_lr < 0:
            raise ValueError(f"base_lr must be >= 0, got {base_lr}")
        if iters_per_epoch < 1:
            raise ValueError(f"iters_per_epoch must be >= 1, got {iters_per_epoch}")
        if not 0 <= warmup_epochs <= num_epochs:
            raise ValueError(f"need 0 <= warmup_epochs <= num_epochs, got warmup_epochs={warmup_epochs}, "
                             f"num_epochs={num_epochs}")
        if mode == "step" and lr_step < 1:
            raise ValueError(f"mode 'step' needs lr_step >= 1 (epochs between decays), got {lr_step}")
        self.mode = mode
        self.base_lr = float(base_lr)
        self.num_epochs = int(num_epochs)
        self.iters_per_epoch = int(iters_per_epoch)
        self.lr_step = int(lr_step)
        self.warmup_epochs = int(warmup_epochs) if float(warmup_epochs).is_integer() else float(warmup_epochs)
        self.head_lr_mult = float(head_lr_mult)
        self.power = float(power)
        self.warmup_iters = round(self.warmup_epochs * self.iters_per_epoch)
        self.total_iters = self.num_epochs * self.iters_per_epoch - self.warmup_iters
        self.epoch = -1  # last epoch announced in the log (PE attribute)
        self.last_epoch = -1  # last iteration T applied (torch attribute name)
        self._step_count = 0
        self._last_lr: List[float] = []
        self.base_lrs: List[float] = []
        self.optimizer: Optional[Optimizer] = None

    def _attach(self, optimizer: Optimizer) -> None:
        """Drive ``optimizer`` and set the rates of iteration 0."""
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.base_lrs = [self.base_lr * self._multiplier(g, k) for k, g in enumerate(optimizer.param_groups)]
        self.step()

    # -- the schedule --------------------------------------------------------------------------------------------
    def lr_at(self, T: int) -> float:  # noqa: N803 - PE notation
        """Learning rate of parameter group 0 at global iteration ``T`` (``T >= 0``)."""
        if T < 0:
            raise ValueError(f"iteration must be >= 0, got {T}")
        if T < self.warmup_iters:
            return self.base_lr * T / self.warmup_iters
        if not self.total_iters:  # the warm-up took the whole run
            return self.base_lr
        t = min(T - self.warmup_iters, self.total_iters)
        if self.mode == "poly":
            return self.base_lr * (1.0 - t / self.total_iters) ** self.power
        if self.mode == "cos":
            return 0.5 * self.base_lr * (1.0 + math.cos(math.pi * t / self.total_iters))
        return self.base_lr * 0.1 ** ((T // self.iters_per_epoch) // self.lr_step)

    def _multiplier(self, group: Dict[str, Any], index: int) -> float:
        if "lr_mult" in group:
            return float(group["lr_mult"])
        return 1.0 if index == 0 else self.head_lr_mult

    def apply(self, optimizer: Optimizer, T: int) -> float:  # noqa: N803
        """Set the rates of iteration ``T`` on ``optimizer``'s groups; return group 0's rate."""
        lr = self.lr_at(T)
        for index, group in enumerate(optimizer.param_groups):
            group["lr"] = lr * self._multiplier(group, index)
        self.last_epoch = T
        self._last_lr = [group["lr"] for group in optimizer.param_groups]
        return lr

    # -- torch.optim.lr_scheduler interface ----------------------------------------------------------------------
    def step(self, epoch: Optional[int] = None) -> None:  # type: ignore[override]
        """Advance one iteration on the attached optimizer (call after ``optimizer.step()``)."""
        if epoch is not None:
            raise ValueError(f"{type(self).__name__}.step() takes no epoch: it advances one iteration")
        self._step_count += 1
        self.apply(self._attached(), self.last_epoch + 1)

    def _attached(self) -> Optimizer:
        if self.optimizer is None:
            raise RuntimeError("no optimizer attached")
        return self.optimizer

    def get_lr(self) -> List[float]:
        """Rates of the attached optimizer's groups at the current iteration."""
        T = max(self.last_epoch, 0)  # noqa: N806
        return [self.lr_at(T) * self._multiplier(g, k) for k, g in enumerate(self._attached().param_groups)]

    def get_last_lr(self) -> List[float]:
        """Rates set by the last call (one per parameter group)."""
        return list(self._last_lr)

    def state_dict(self) -> Dict[str, Any]:
        """Everything but the optimizer (plain numbers and strings: safe for ``weights_only`` loading)."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (schedule settings and position)."""
        state_dict = {_OLD_KEYS.get(k, k): v for k, v in state_dict.items()}  # saved before a rename
        unknown = set(state_dict) - set(self.state_dict())
        if unknown:
            raise KeyError(f"not an {type(self).__name__} state dict: unexpected keys {sorted(unknown)}")
        self.__dict__.update(state_dict)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(mode={self.mode!r}, base_lr={self.base_lr}, num_epochs={self.num_epochs}, "
                f"iters_per_epoch={self.iters_per_epoch}, lr_step={self.lr_step}, "
                f"warmup_epochs={self.warmup_epochs}, head_lr_mult={self.head_lr_mult})")
