"""Shared check for equivalence tests: one SGD step of a parallel setup against the plain single-device one."""
from typing import Callable, Sequence

import torch
from torch import nn


def assert_same_sgd_step(plain: nn.Module, parallel: nn.Module, x: torch.Tensor,
                         plain_loss: Callable[[torch.Tensor], torch.Tensor],
                         parallel_loss: Callable[[torch.Tensor], torch.Tensor],
                         optimizers: Sequence[torch.optim.Optimizer],
                         close: Callable[[torch.Tensor, torch.Tensor], None]) -> None:
    """Run one step of both setups on copies of ``x`` and check loss, input gradient and every parameter gradient.

    Args:
        plain: the reference module (its parameters are compared with ``parallel``'s, in order).
        parallel: the module whose wrapped copy ``parallel_loss`` trains.
        x: the batch (each side gets its own copy requiring grad).
        plain_loss: ``x -> loss`` of the reference.
        parallel_loss: ``x -> loss`` of the parallel setup (may assert on its outputs).
        optimizers: both optimizers (zeroed before, stepped after).
        close: the comparison, e.g. ``assert_close`` with the test's tolerance.
    """
    x_plain, x_parallel = x.clone().requires_grad_(), x.clone().requires_grad_()
    loss_plain, loss_parallel = plain_loss(x_plain), parallel_loss(x_parallel)
    close(loss_parallel, loss_plain)
    for optimizer in optimizers:
        optimizer.zero_grad()
    loss_plain.backward()
    loss_parallel.backward()
    close(x_parallel.grad, x_plain.grad)
    for p, q in zip(plain.parameters(), parallel.parameters()):
        close(q.grad, p.grad)
    for optimizer in optimizers:
        optimizer.step()
