"""Floating-point operations of a model's forward pass, counted by torch's ``FlopCounterMode`` on fake tensors.

Nothing is computed and no memory is allocated: the model runs under ``FakeTensorMode`` (real parameters are
wrapped as fake ones), so counting a ResNeSt-269 model at 512x512 costs only the time to trace its operators.
``FlopCounterMode`` counts a multiply-add as two operations (convolutions, matrix products, attention).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["count_flops", "fake_mode"]


def fake_mode() -> FakeTensorMode:
    """A ``FakeTensorMode`` to build a model in (``with fake_mode(): model = get_segmentation_model(...)``): its
    parameters are fake, so building it is nearly free; pass it to :func:`count_flops`."""
    return FakeTensorMode(allow_non_fake_inputs=True)


@contextlib.contextmanager
def _eval(model: nn.Module) -> Iterator[None]:
    training = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, flag in training:
            module.train(flag)


def count_flops(model: nn.Module, size: Sequence[int] = (512, 512), batch: int = 1) -> int:
    """Floating-point operations of ``model``'s forward (eval mode) on ``batch`` RGB images of ``size``.

    Args:
        model: any module taking ``B x 3 x H x W`` (real or built under :func:`fake_mode`).
        size: ``(H, W)``.
        batch: images per forward.

    Returns:
        The total count of ``FlopCounterMode`` (a multiply-add counts 2).

    Example:
        >>> from encoding.models import get_segmentation_model
        >>> model = get_segmentation_model("fcn", backbone="vgg_tiny", nclass=2)
        >>> count_flops(model, (64, 64)) > 0
        True
    """
    height, width = size
    parameter = next(model.parameters(), None)
    dtype = parameter.dtype if parameter is not None else torch.float32
    with _eval(model), torch.no_grad(), fake_mode():
        image = torch.empty(batch, 3, height, width, dtype=dtype)
        with FlopCounterMode(display=False) as counter:
            model(image)
    return counter.get_total_flops()
