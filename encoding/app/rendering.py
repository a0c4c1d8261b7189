"""What the Segment tab shows of one segmented image, at the image's size, each made once and vectorised: the overlay
(the image blended with the class colours: one table look-up and integer arithmetic per pixel, no Python loop over
pixels), its file (JPEG: a 12-megapixel overlay is encoded in a fraction of a second, where PNG takes seconds; the
exact labels are the mask PNG's) and the legend of the classes present, as HTML beside the image, so that it reads
the same at any image size.
"""
from __future__ import annotations

import html
import io
from typing import Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from ..inference.evaluation import background_ids
from ..inference.loading import ModelInfo
from ..utils.files import atomic_write

__all__ = ["ALPHA", "OVERLAY_QUALITY", "blend", "write_overlay", "present_legend_html"]

#: The weight of the class colours in the overlay (the background class shows the image unblended).
ALPHA = 0.5
#: The overlay's JPEG quality (full chroma resolution: class borders stay sharp).
OVERLAY_QUALITY = 90


def _tables(info: ModelInfo, weight: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per class id: ``weight * colour + 128`` (``uint16``, ``n x 3``: the colour's part of the blend, with the
    rounding) and whether the class shows the image as it is (the background); one last row for the ids outside the
    palette, which show the image too."""
    count = len(info.palette)
    colours = np.zeros((count + 1, 3), np.uint16)
    colours[:count] = np.asarray(info.palette, np.uint16).reshape(-1, 3)
    unblended = np.zeros(count + 1, bool)
    unblended[[c for c in background_ids(info.classes) if c < count] + [count]] = True
    return colours * weight + 128, unblended


def blend(image: np.ndarray, labels: torch.Tensor, info: ModelInfo, alpha: float = ALPHA) -> np.ndarray:
    """The ``H x W x 3`` ``uint8`` image blended with the colours of its ``H x W`` class ids (the network's palette):
    ``(1 - alpha) * image + alpha * colour``, rounded (in 1/256ths); the background class and ids outside the
    palette show the image as it is. Whole-array operations: about 0.1 s per megapixel on one CPU core.

    Raises:
        ValueError: labels of another size than the image, or ``alpha`` outside ``[0, 1]``.
    """
    ids = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if ids.shape != image.shape[:2]:
        raise ValueError(f"labels of size {ids.shape} do not match the image's {image.shape[:2]}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    weight = int(round(alpha * 256))
    colour_part, unblended = _tables(info, weight)
    outside = len(unblended) - 1
    if ids.size and (ids.min() < 0 or ids.max() >= outside):
        ids = np.where((ids >= 0) & (ids < outside), ids, outside)
    out = image.astype(np.uint16)
    out *= 256 - weight
    out += colour_part[ids]
    out >>= 8
    out = out.astype(np.uint8)
    np.copyto(out, image, where=unblended[ids][..., None])
    return out


def write_overlay(overlay: np.ndarray, path: str, quality: int = OVERLAY_QUALITY) -> str:
    """Encode the overlay once, as JPEG, to ``path`` (atomically); returns ``path``."""
    buffer = io.BytesIO()
    Image.fromarray(overlay, "RGB").save(buffer, format="JPEG", quality=quality, subsampling=0)
    atomic_write(path, buffer.getvalue())
    return path


def present_legend_html(shares: Sequence[Tuple[str, Tuple[int, int, int], int, float]]) -> str:
    """The classes present (``(name, colour, pixels, fraction)``, largest first: :func:`.segmentation.class_shares`)
    as an HTML legend: a colour swatch, the name and the share of the image, in text of the page's size."""
    items = []
    for name, (r, g, b), _, share in shares:
        items.append(f'<span style="display:inline-block;margin:2px 12px 2px 0;white-space:nowrap"><span style="'
                     f'display:inline-block;width:14px;height:14px;background:rgb({r},{g},{b});border:1px solid '
                     f'#000;vertical-align:middle"></span> {html.escape(name)} ({100 * share:.1f} %)</span>')
    return f'<div class="encoding-present-legend">{"".join(items)}</div>'
