"""PyTorch-Encoding's ``LR_Scheduler`` / ``LR_Scheduler_Head``: its driving style on the torch-style core.

The core schedule is :class:`~encoding.utils.lr_scheduler.IterationLR` (``step()`` once per iteration); PE's call
``scheduler(optimizer, i, epoch, best_pred)`` lives only here. Both names are
declared in ``encoding.utils`` and ``encoding.utils.lr_scheduler`` beside the definition.
"""
from __future__ import annotations

from typing import Optional

from torch.optim import Optimizer

from ..utils.lr_scheduler import IterationLR, logger as _schedule_logger
from .declare import alias, old_name

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

    Signature: ``LR_Scheduler(mode, base_lr, num_epochs, iters_per_epoch, lr_step=0, warmup_epochs=0, *,
    optimizer=None, head_lr_mult=10.0, power=0.9)``.

    Args:
        mode, base_lr, num_epochs, iters_per_epoch: as in :class:`~encoding.utils.lr_scheduler.IterationLR`.
        *steps: ``lr_step`` (epochs between two ×0.1 decays, ``step`` mode) and ``warmup_epochs``.
        optimizer: attach an optimizer to use the scheduler torch-style (``step()``); optional for PE style.
        **options: ``head_lr_mult`` (factor of groups after the first, default 10; ``head_multiplier``, its old name,
            with a ``FutureWarning``) and ``power`` (poly, 0.9).

    Example:
        >>> opt = torch.optim.SGD([{"params": backbone}, {"params": head}], lr=0.01)  # doctest: +SKIP
        >>> sched = LR_Scheduler("poly", 0.01, num_epochs=50, iters_per_epoch=len(loader))  # doctest: +SKIP
        >>> for epoch in range(50):  # doctest: +SKIP
        ...     for i, batch in enumerate(loader):
        ...         sched(opt, i, epoch, best_pred)      # backbone 0.01 * f(T), head 0.1 * f(T)
    """

    def __init__(self, mode: str, base_lr: float, num_epochs: int, iters_per_epoch: int, *steps: int,
                 optimizer: Optional[Optimizer] = None, **options: float) -> None:
        # steps: (lr_step, warmup_epochs); options: head_lr_mult, power -- the core's schedule arguments
        self._configure(mode, base_lr, num_epochs, iters_per_epoch, *steps, **options)
        if optimizer is not None:
            self._attach(optimizer)

    def __call__(self, optimizer: Optimizer, i: int, epoch: int, best_pred: Optional[float] = None) -> float:
        """Set the rates for iteration ``i`` of ``epoch`` (PE style) and return group 0's rate."""
        lr = self.apply(optimizer, epoch * self.iters_per_epoch + i)
        if epoch > self.epoch:
            best = "" if best_pred is None else f", previous best = {best_pred:.4f}"
            _schedule_logger.info("Epoch %d, learning rate = %.6g%s", epoch, lr, best)
            self.epoch = epoch
        return lr

    def _attached(self) -> Optimizer:
        if self.optimizer is None:
            raise RuntimeError("no optimizer attached: pass optimizer= to LR_Scheduler, or call "
                               "scheduler(optimizer, i, epoch, best_pred) PyTorch-Encoding style")
        return self.optimizer


#: PyTorch-Encoding's name for the scheduler with 10x head groups (:class:`LR_Scheduler` already does that).
LR_Scheduler_Head = alias(LR_Scheduler, "LR_Scheduler_Head", "encoding.utils", "encoding.utils.lr_scheduler")
