"""The training steps the memory tool plans for: a segmentation model of the zoo on square crops."""
from __future__ import annotations

from typing import Optional, Union

import torch

from .program import StepSpec

__all__ = ["segmentation_spec"]


def segmentation_spec(model: str, backbone: str, nclass: int, crop_size: int, aux: bool = False,
                      se_loss: bool = False, amp_dtype: Optional[torch.dtype] = None, seed: int = 0,
                      checkpoint: Union[bool, str] = False, keep_outputs: bool = False) -> StepSpec:
    """A training step of ``get_segmentation_model(model, backbone, nclass, aux, se_loss, checkpoint)`` on
    ``crop_size`` crops with :class:`~encoding.nn.SegmentationLosses` and SGD (momentum 0.9, weight decay 1e-4).
    ``checkpoint`` is the activation-checkpointing policy (``False``, ``"none"``, ``"backbone"``, ``"all"``);
    ``keep_outputs`` the loop that holds the outputs through backward (:class:`~encoding.memory.StepSpec`)."""
    from ..models import get_segmentation_model
    from ..nn import SegmentationLosses

    def build() -> torch.nn.Module:
        torch.manual_seed(seed)
        return get_segmentation_model(model, backbone=backbone, nclass=nclass, aux=aux, se_loss=se_loss,
                                      checkpoint=False if checkpoint == "none" else checkpoint)

    def make_inputs(share: int):
        return (torch.randn(share, 3, crop_size, crop_size),), {}

    def make_target(share: int) -> torch.Tensor:
        return torch.randint(0, nclass, (share, crop_size, crop_size))

    criterion = SegmentationLosses(se_loss=se_loss, aux=aux, nclass=nclass)
    return StepSpec(build_model=build, make_inputs=make_inputs, make_target=make_target, criterion=criterion,
                    amp_dtype=amp_dtype, keep_outputs=keep_outputs)
