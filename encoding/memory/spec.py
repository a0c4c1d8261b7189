"""The training steps the memory tool plans for: a network (:class:`~encoding.models.network.NetworkSpec`, the one
description training builds from) on square crops."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch

from ..utils.renamed import renamed_keyword
from ..models.network import NetworkSpec
from ..nn.recompute import RECOMPUTE_POLICIES
from .program import StepSpec, default_optimizer

__all__ = ["step_spec", "segmentation_spec", "buildable_policies"]


def step_spec(network: NetworkSpec, crop_size: int, *, amp_dtype: Optional[torch.dtype] = None, seed: int = 0,
              keep_outputs: bool = False, loss: str = "ce",
              optimizer: Callable[[Any], torch.optim.Optimizer] = default_optimizer) -> StepSpec:
    """A training step of ``network.build()`` (exactly what training builds: head width, output stride,
    recomputation ...) on ``crop_size`` crops with the pixel loss ``loss`` of :data:`~encoding.nn.LOSSES` (aux and SE
    terms as the network has them) and ``optimizer`` (default: SGD, momentum 0.9, weight decay 1e-4;
    :func:`~encoding.memory.optimizers.optimizer_factory` makes training's others); ``keep_outputs`` is the loop that
    holds the outputs through backward (:class:`~encoding.memory.StepSpec`)."""
    from ..nn import LOSSES

    nclass = network.nclass

    def build() -> torch.nn.Module:
        torch.manual_seed(seed)
        return network.build()

    def make_inputs(share: int):
        return (torch.randn(share, 3, crop_size, crop_size),), {}

    def make_target(share: int) -> torch.Tensor:
        return torch.randint(0, nclass, (share, crop_size, crop_size))

    criterion = LOSSES.get(loss)(se_loss=network.se_loss, aux=network.aux, nclass=nclass)
    return StepSpec(build_model=build, make_inputs=make_inputs, make_target=make_target, criterion=criterion,
                    optimizer=optimizer, amp_dtype=amp_dtype, keep_outputs=keep_outputs)


def segmentation_spec(model: str, backbone: str, nclass: int, crop_size: int, aux: bool = False,
                      se_loss: bool = False, amp_dtype: Optional[torch.dtype] = None, seed: int = 0,
                      recompute: Any = "none", keep_outputs: bool = False, **old: Any) -> StepSpec:
    """:func:`step_spec` of ``NetworkSpec(model, nclass, backbone, aux, se_loss, recompute)`` (``recompute``:
    ``"none"``, ``"backbone"`` or ``"all"``; ``checkpoint=``, its old name, warns)."""
    recompute = renamed_keyword(old, "checkpoint", "recompute", recompute, "segmentation_spec")
    network = NetworkSpec(model, nclass, backbone=backbone, aux=aux, se_loss=se_loss, recompute=recompute)
    return step_spec(network, crop_size, amp_dtype=amp_dtype, seed=seed, keep_outputs=keep_outputs)


def buildable_policies(network: NetworkSpec) -> Tuple[str, ...]:
    """The recomputation policies the network's build applies, cheapest first: every one for a network of the
    registry; for a spec network (``torchvision:``, ``module:`` ...) those its build does not refuse (one without
    a backbone of blocks refuses them), so that the advice lists no row whose saving would not happen."""
    from ..errors import EncodingError
    from ..names import is_model_spec

    if not is_model_spec(network.model):
        return RECOMPUTE_POLICIES
    kept = []
    for policy in RECOMPUTE_POLICIES:
        try:
            with torch.device("meta"):
                network.replace(recompute=policy).build()
        except EncodingError:
            continue
        kept.append(policy)
    return tuple(kept)
