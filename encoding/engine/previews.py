"""Preview images of a run for TensorBoard / W&B: a few validation images, their masks and the model's predictions.

:func:`validation_previews` gives, for the first ``count`` validation samples, one ``H x W x 3`` ``uint8`` picture:
the image, the image blended with its mask and the image blended with the prediction, side by side (the dataset's
palette; ignored pixels show the image). The run logs them every ``log_images`` epochs (:class:`.hooks.Previews`).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np
import torch
from torch import nn

from ..datasets.transforms import denormalize
from ..utils.checkpoint import unwrap_model
from ..utils.palette import overlay
from .loop import predicted_labels

__all__ = ["validation_previews"]


def _displayable(image: torch.Tensor) -> np.ndarray:
    """A normalised ``3 x H x W`` dataset image (ImageNet mean / std) as ``H x W x 3`` ``uint8``."""
    rgb = denormalize(image.detach().float())
    return (rgb.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)


@torch.inference_mode()
def validation_previews(model: nn.Module, dataset: Any, palette: Any, count: int = 4,
                        device: Optional[torch.device] = None) -> Dict[str, np.ndarray]:
    """``{"val/<i>": image | mask overlay | prediction overlay}`` for the first ``count`` samples of ``dataset``.

    Args:
        model: the (possibly wrapped) model; its plain module predicts, one image at a time, on its own device
            (a DDP-wrapped model is not called: only the main process makes previews; an FSDP-sharded one gathers
            its weights from every process in each forward: every process calls this function).
        dataset: ``(image, mask, ...)`` samples (a validation split).
        palette: a dataset name or explicit palette (:func:`~encoding.utils.palette.overlay`).
        device: where the images go (default: the device of the model's first parameter).
    """
    net = unwrap_model(model)
    if device is None:
        device = next(net.parameters()).device
    was_training = net.training
    net.eval()
    previews = {}
    try:
        for i in range(min(count, len(dataset))):
            image, mask = dataset[i][:2]
            labels = predicted_labels(net(image.unsqueeze(0).to(device)))[0]
            shown = _displayable(image)
            panels = [shown, np.asarray(overlay(shown, mask.numpy(), palette)),
                      np.asarray(overlay(shown, labels.numpy(), palette))]
            previews[f"val/{i}"] = np.concatenate(panels, axis=1)
    finally:
        net.train(was_training)
    return previews
