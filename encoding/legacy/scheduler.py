"""PyTorch-Encoding's ``LR_Scheduler`` / ``LR_Scheduler_Head``: its driving style on the torch-style core.

The core schedule is :class:`~encoding.utils.lr_scheduler.IterationLR` (``step()`` once per iteration); PE's call
``scheduler(optimizer, i, epoch, best_pred)`` lives only here. Both names are
declared in ``encoding.utils`` and ``encoding.utils.lr_scheduler`` beside the definition.
"""
from __future__ import annotations

import warnings
from typing import Dict, Optional, Tuple

from torch.optim import Optimizer

from ..utils.lr_scheduler import IterationLR, logger as _schedule_logger
from .declare import old_name

__all__ = ["LR_Scheduler", "LR_Scheduler_Head"]


@old_name("encoding.utils", "encoding.utils.lr_scheduler",
          new="encoding.utils.IterationLR (scheduler.step() after each optimizer.step())")
class LR_Scheduler(IterationLR):  # noqa: N801 - PyTorch-Encoding name
    """PyTorch-Encoding's scheduler: :class:`~encoding.utils.lr_scheduler.IterationLR` with an optional optimizer.

    Two ways to drive it:

    * PE style: ``scheduler(optimizer, i, epoch, best_pred)`` at every iteration (no optimizer needed up front);
    * torch style: ``LR_Scheduler(..., optimizer=opt)`` sets the rate of iteration 0 right away, then
      ``scheduler.step()`` after each ``optimizer.step()``.

    ``state_dict()``/``load_state_dict()`` resume either way; ``last_epoch`` counts *iterations* (the last ``T``
    applied), as in the core.

    Signature: ``LR_Scheduler(mode, base_lr, num_epochs, iters_per_epoch=0, lr_step=0, warmup_epochs=0, *,
    optimizer=None, quiet=False, head_lr_mult=1.0, power=0.9)``: one rate for every parameter group, as
    PyTorch-Encoding's ``LR_Scheduler``; :class:`LR_Scheduler_Head` runs the groups after the first at 10x.

    ``iters_per_epoch=0`` (PE's default) serves PE's ``step`` mode, whose rate depends on the epoch alone
    (``base_lr * 0.1 ** (epoch // lr_step)``): driven PE style only, it has no warm-up (PE's ``warmup_epochs * 0``
    iterations; a ``warmup_epochs`` given warns). ``poly`` / ``cos`` need it (PE divided by zero).

    Args:
        mode, base_lr, num_epochs, iters_per_epoch: as in :class:`~encoding.utils.lr_scheduler.IterationLR`.
        *steps: ``lr_step`` (epochs between two ×0.1 decays, ``step`` mode) and ``warmup_epochs``.
        optimizer: attach an optimizer to use the scheduler torch-style (``step()``); optional for PE style.
        quiet: do not announce each epoch's rate (PE's keyword).
        **options: ``head_lr_mult`` (factor of groups after the first, default :attr:`HEAD_LR_MULT`;
            ``head_multiplier``, its old name, with a ``FutureWarning``) and ``power`` (poly, 0.9).

    Example:
        >>> opt = torch.optim.SGD([{"params": backbone}, {"params": head}], lr=0.01)  # doctest: +SKIP
        >>> sched = LR_Scheduler_Head("poly", 0.01, num_epochs=50, iters_per_epoch=len(loader))  # doctest: +SKIP
        >>> for epoch in range(50):  # doctest: +SKIP
        ...     for i, batch in enumerate(loader):
        ...         sched(opt, i, epoch, best_pred)      # backbone 0.01 * f(T), head 0.1 * f(T)
    """

    #: The factor of the parameter groups after the first (PyTorch-Encoding's ``LR_Scheduler``: one rate).
    HEAD_LR_MULT = 1.0

    def __init__(self, mode: str, base_lr: float, num_epochs: int, iters_per_epoch: int = 0, *steps: int,
                 optimizer: Optional[Optimizer] = None, quiet: bool = False, **options: float) -> None:
        # steps: (lr_step, warmup_epochs); options: head_lr_mult, power -- the core's schedule arguments
        if "head_multiplier" not in options:
            options.setdefault("head_lr_mult", self.HEAD_LR_MULT)
        #: PE's iters_per_epoch=0: the rate of epoch e is the core's at T = e with one iteration per epoch.
        self.epoch_only = iters_per_epoch == 0
        if self.epoch_only:
            steps, options = _epoch_only(mode, optimizer, steps, options)
        self._configure(mode, base_lr, num_epochs, iters_per_epoch or 1, *steps, **options)
        self.quiet = quiet
        if optimizer is not None:
            self._attach(optimizer)

    def __call__(self, optimizer: Optimizer, i: int, epoch: int, best_pred: Optional[float] = None) -> float:
        """Set the rates for iteration ``i`` of ``epoch`` (PE style) and return group 0's rate."""
        lr = self.apply(optimizer, epoch if self.epoch_only else epoch * self.iters_per_epoch + i)
        if epoch > self.epoch:
            best = "" if best_pred is None else f", previous best = {best_pred:.4f}"
            if not self.quiet:
                _schedule_logger.info("Epoch %d, learning rate = %.6g%s", epoch, lr, best)
            self.epoch = epoch
        return lr

    def _attached(self) -> Optimizer:
        if self.optimizer is None:
            raise RuntimeError("no optimizer attached: pass optimizer= to LR_Scheduler, or call "
                               "scheduler(optimizer, i, epoch, best_pred) PyTorch-Encoding style")
        return self.optimizer


def _epoch_only(mode: str, optimizer: Optional[Optimizer], steps: Tuple[int, ...],
                options: Dict[str, float]) -> Tuple[Tuple[int, ...], Dict[str, float]]:
    """Check ``iters_per_epoch=0`` (PE's default) and return the schedule arguments without a warm-up."""
    if mode != "step" or optimizer is not None:
        raise ValueError(f"iters_per_epoch must be >= 1 for mode {mode!r}"
                         f"{' driven torch style (optimizer=)' if optimizer is not None else ''}; "
                         "iters_per_epoch=0 (PyTorch-Encoding's default) serves only 'step' mode driven as "
                         "scheduler(optimizer, i, epoch, best_pred)")
    warmup = options.pop("warmup_epochs", steps[1] if len(steps) > 1 else 0)
    if warmup:
        warnings.warn(f"LR_Scheduler: warmup_epochs={warmup} has no effect with iters_per_epoch=0 (as in "
                      "PyTorch-Encoding: 0 warm-up iterations); pass iters_per_epoch=len(loader)", UserWarning,
                      stacklevel=4)
    return steps[:1], options


@old_name("encoding.utils", "encoding.utils.lr_scheduler",
          new="encoding.utils.IterationLR (head_lr_mult=10 by default; scheduler.step() after each optimizer.step())")
class LR_Scheduler_Head(LR_Scheduler):  # noqa: N801 - PyTorch-Encoding name
    """PyTorch-Encoding's scheduler of its segmentation scripts: :class:`LR_Scheduler` with the parameter groups
    after the first (the new heads) at 10x the rate."""

    HEAD_LR_MULT = 10.0
