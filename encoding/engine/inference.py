"""Inference helpers for evaluation and demo scripts: read an image, segment it, write coloured masks and overlays.

* :func:`read_image`: any JPEG/PNG (grey-scale, palette or RGBA converted to RGB) as a normalised tensor, with a
  one-line :class:`~encoding.datasets.DatasetError` naming a file that is not an image;
* :func:`segment`: class ids of one image of any size (single scale, or through a
  :class:`~encoding.models.MultiEvalModule`);
* :class:`PredictionWriter`: coloured PNG masks (dataset palette, class ids as pixel values) named after the inputs;
* :func:`overlay_with_legend`: the image blended with its mask, with a legend of the classes present.
"""
from __future__ import annotations

import io
import os
from typing import Any, List, Optional, Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor, nn

from ..datasets.base import BaseDataset
from ..datasets.transforms import IMAGENET_MEAN, IMAGENET_STD, image_transform
from .loop import predicted_labels
from ..utils.files import atomic_write
from ..utils.palette import colorize, get_palette, overlay

__all__ = ["read_image", "denormalize", "segment", "PredictionWriter", "prediction_filename", "save_png",
           "overlay_with_legend"]


def read_image(path: str) -> Tensor:
    """The image at ``path`` as a normalised ``float32 3 x H x W`` tensor (ImageNet mean/std, as the datasets).

    Raises:
        DatasetError: the file is missing or is not a readable image (the message names it).
    """
    return image_transform()(BaseDataset._read_image(path)).as_subclass(Tensor)


def denormalize(image: Tensor) -> Tensor:
    """Undo :func:`read_image`'s normalisation: ``3 x H x W`` in ``[0, 1]`` (for :func:`overlay_with_legend`)."""
    mean = torch.tensor(IMAGENET_MEAN, dtype=image.dtype).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=image.dtype).view(3, 1, 1)
    return (image.cpu() * std + mean).clamp(0, 1)


@torch.inference_mode()
def segment(model: nn.Module, image: Tensor, device: Optional[torch.device] = None) -> Tensor:
    """Class ids (``H x W`` ``int64``, on the CPU) of one normalised ``3 x H x W`` image.

    Args:
        model: a segmentation model (output ``{"out": ...}`` or logits at the input size), or a
            :class:`~encoding.models.MultiEvalModule` for multi-scale inference; in eval mode.
        image: from :func:`read_image` (any size).
        device: where to run (default: the model's parameters' device).
    """
    if device is None:
        device = next(model.parameters()).device
    return predicted_labels(model(image.unsqueeze(0).to(device)))[0]


def prediction_filename(name: str) -> str:
    """``"dir/2008_000123.jpg"`` -> ``"2008_000123.png"``: the file a prediction of that input is written to."""
    return os.path.splitext(os.path.basename(name))[0] + ".png"


class PredictionWriter:
    """Write predicted class maps as coloured PNGs named after their input files.

    The PNGs are palettised (:func:`~encoding.utils.colorize`): their pixel values are the class ids and their
    palette the dataset's colours, so ``np.array(Image.open(path))`` gives the prediction back.

    Args:
        out_dir: where the PNGs go (created).
        dataset: a dataset name (its palette) or an explicit list of RGB triples.

    Example:
        >>> writer = PredictionWriter("preds", "shapes")          # doctest: +SKIP
        >>> writer([labels], ["000001.jpg"])                       # doctest: +SKIP -> preds/000001.png
    """

    def __init__(self, out_dir: str, dataset: Any) -> None:
        self.out_dir, self.dataset = out_dir, dataset
        os.makedirs(out_dir, exist_ok=True)
        self.written: List[str] = []

    def __call__(self, labels: Sequence[Tensor], names: Sequence[str]) -> None:
        if len(labels) != len(names):
            raise ValueError(f"{len(labels)} predictions for {len(names)} file names")
        for label, name in zip(labels, names):
            path = os.path.join(self.out_dir, prediction_filename(name))
            save_png(colorize(label, self.dataset), path)
            self.written.append(path)


def save_png(image: Image.Image, path: str) -> None:
    """Write ``image`` as a PNG at ``path`` atomically (no half-written file is ever seen there)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    atomic_write(path, buffer.getvalue())


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed-size bitmap font
        return ImageFont.load_default()


def overlay_with_legend(image: Any, labels: Any, dataset: str, class_names: Sequence[str],
                        alpha: float = 0.5) -> Image.Image:
    """The image blended with its coloured mask, above a legend of the classes present (colour swatch + name).

    Args:
        image: PIL image, ``H x W x 3`` uint8 array or ``3 x H x W`` tensor in ``[0, 1]``.
        labels: ``H x W`` class ids.
        dataset: dataset name (its palette).
        class_names: name of every class id.
        alpha: weight of the mask colours.

    Returns:
        An RGB image as wide as the input and taller by the legend (one row of 16 px per class present).
    """
    blended = overlay(image, labels, dataset, alpha)
    ids = np.asarray(labels).reshape(-1)
    present = [int(c) for c in np.unique(ids) if 0 <= c < len(class_names)]
    palette, row = get_palette(dataset), 16
    legend = Image.new("RGB", (blended.width, row * len(present) + 4), (255, 255, 255))
    draw, font = ImageDraw.Draw(legend), _font(row - 4)
    for i, cls in enumerate(present):
        top = 2 + i * row
        draw.rectangle([4, top + 2, 4 + row - 4, top + row - 2], fill=tuple(palette[cls]), outline=(0, 0, 0))
        draw.text((row + 6, top), class_names[cls], fill=(0, 0, 0), font=font)
    out = Image.new("RGB", (blended.width, blended.height + legend.height), (255, 255, 255))
    out.paste(blended, (0, 0))
    out.paste(legend, (0, blended.height))
    return out
