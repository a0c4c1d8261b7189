"""Colour palettes of the segmentation datasets and helpers to turn label masks into images.

Palettes (one RGB triple per class, index = class id after our ``-1``-ignore mapping):

* ``pascal_voc``, ``pascal_aug``, ``coco``, ``pcontext`` (and PE's ``detail``): the PASCAL VOC bit-interleaved
  colour map (class ``i`` takes bits ``0/1/2`` of ``i``, ``i >> 3``, ... as the high bits of R/G/B).
* ``ade20k``: the 150 colours of the ADE20K scene-parsing benchmark (the table published with the CSAIL toolkit).
* ``citys``: the official Cityscapes colours of the 19 train ids.
* ``shapes``: seven distinct colours for ``background, disc, square, triangle, star, ring, bar``.

Ignored pixels (``-1`` or ``255`` in a mask) are drawn with the dataset's *ignore colour*, which differs from every
class colour: VOC's own "void" colour ``(224, 224, 192)`` for the VOC family, black for ADE20K and Cityscapes
(their "unlabeled" colour) and white for ``shapes`` (whose background is black). :func:`colorize` stores the mask as
a PIL ``"P"`` image whose index 255 is the ignore colour, so saved PNGs keep the class ids as pixel values.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np
from PIL import Image

__all__ = [
    "PALETTE_NAMES",
    "get_palette",
    "get_ignore_color",
    "voc_palette",
    "colorize",
    "get_mask_pallete",
    "overlay",
]

RGB = Tuple[int, int, int]
Palette = Tuple[RGB, ...]
PaletteLike = Union[str, Sequence[Sequence[int]]]

IGNORE_INDEX = 255  # palette slot of ignored pixels in the "P" images

_ADE20K: Palette = (
    (120, 120, 120), (180, 120, 120), (6, 230, 230), (80, 50, 50), (4, 200, 3), (120, 120, 80), (140, 140, 140),
    (204, 5, 255), (230, 230, 230), (4, 250, 7), (224, 5, 255), (235, 255, 7), (150, 5, 61), (120, 120, 70),
    (8, 255, 51), (255, 6, 82), (143, 255, 140), (204, 255, 4), (255, 51, 7), (204, 70, 3), (0, 102, 200),
    (61, 230, 250), (255, 6, 51), (11, 102, 255), (255, 7, 71), (255, 9, 224), (9, 7, 230), (220, 220, 220),
    (255, 9, 92), (112, 9, 255), (8, 255, 214), (7, 255, 224), (255, 184, 6), (10, 255, 71), (255, 41, 10),
    (7, 255, 255), (224, 255, 8), (102, 8, 255), (255, 61, 6), (255, 194, 7), (255, 122, 8), (0, 255, 20),
    (255, 8, 41), (255, 5, 153), (6, 51, 255), (235, 12, 255), (160, 150, 20), (0, 163, 255), (140, 140, 140),
    (250, 10, 15), (20, 255, 0), (31, 255, 0), (255, 31, 0), (255, 224, 0), (153, 255, 0), (0, 0, 255),
    (255, 71, 0), (0, 235, 255), (0, 173, 255), (31, 0, 255), (11, 200, 200), (255, 82, 0), (0, 255, 245),
    (0, 61, 255), (0, 255, 112), (0, 255, 133), (255, 0, 0), (255, 163, 0), (255, 102, 0), (194, 255, 0),
    (0, 143, 255), (51, 255, 0), (0, 82, 255), (0, 255, 41), (0, 255, 173), (10, 0, 255), (173, 255, 0),
    (0, 255, 153), (255, 92, 0), (255, 0, 255), (255, 0, 245), (255, 0, 102), (255, 173, 0), (255, 0, 20),
    (255, 184, 184), (0, 31, 255), (0, 255, 61), (0, 71, 255), (255, 0, 204), (0, 255, 194), (0, 255, 82),
    (0, 10, 255), (0, 112, 255), (51, 0, 255), (0, 194, 255), (0, 122, 255), (0, 255, 163), (255, 153, 0),
    (0, 255, 10), (255, 112, 0), (143, 255, 0), (82, 0, 255), (163, 255, 0), (255, 235, 0), (8, 184, 170),
    (133, 0, 255), (0, 255, 92), (184, 0, 255), (255, 0, 31), (0, 184, 255), (0, 214, 255), (255, 0, 112),
    (92, 255, 0), (0, 224, 255), (112, 224, 255), (70, 184, 160), (163, 0, 255), (153, 0, 255), (71, 255, 0),
    (255, 0, 163), (255, 204, 0), (255, 0, 143), (0, 255, 235), (133, 255, 0), (255, 0, 235), (245, 0, 255),
    (255, 0, 122), (255, 245, 0), (10, 190, 212), (214, 255, 0), (0, 204, 255), (20, 0, 255), (255, 255, 0),
    (0, 153, 255), (0, 41, 255), (0, 255, 204), (41, 0, 255), (41, 255, 0), (173, 0, 255), (0, 245, 255),
    (71, 0, 255), (122, 0, 255), (0, 255, 184), (0, 92, 255), (184, 255, 0), (0, 133, 255), (255, 214, 0),
    (25, 194, 194), (102, 255, 0), (92, 0, 255),
)

_CITYSCAPES: Palette = (
    (128, 64, 128), (244, 35, 232), (70, 70, 70), (102, 102, 156), (190, 153, 153), (153, 153, 153),
    (250, 170, 30), (220, 220, 0), (107, 142, 35), (152, 251, 152), (70, 130, 180), (220, 20, 60), (255, 0, 0),
    (0, 0, 142), (0, 0, 70), (0, 60, 100), (0, 80, 100), (0, 0, 230), (119, 11, 32),
)

# background, disc, square, triangle, star, ring, bar
_SHAPES: Palette = (
    (0, 0, 0), (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
)

_BLACK: RGB = (0, 0, 0)
_WHITE: RGB = (255, 255, 255)

# name -> (number of classes, palette source, ignore colour); the VOC family reads its colours from voc_palette().
_DATASETS: Dict[str, Tuple[int, str, Optional[RGB]]] = {
    "pascal_voc": (21, "voc", None),
    "pascal_aug": (21, "voc", None),
    "coco": (21, "voc", None),
    "pcontext": (59, "voc", None),
    "detail": (59, "voc", None),  # PyTorch-Encoding's default name for the VOC colour map
    "ade20k": (150, "ade20k", _BLACK),
    "citys": (19, "citys", _BLACK),
    "shapes": (7, "shapes", _WHITE),
}
_TABLES: Dict[str, Palette] = {"ade20k": _ADE20K, "citys": _CITYSCAPES, "shapes": _SHAPES}

PALETTE_NAMES: Tuple[str, ...] = tuple(_DATASETS)


@lru_cache(maxsize=None)
def voc_palette(num: int = 256) -> Palette:
    """The PASCAL VOC colour map: bit ``3k + c`` of the class id becomes bit ``7 - k`` of channel ``c``.

    Args:
        num: number of entries (at most 256).

    Returns:
        ``num`` RGB triples; entry 0 is black and entry 255 the VOC "void" colour ``(224, 224, 192)``.
    """
    if not 0 < num <= 256:
        raise ValueError(f"num must be in [1, 256], got {num}")
    colors = []
    for index in range(num):
        rgb = [0, 0, 0]
        for k in range(8):
            for c in range(3):
                rgb[c] |= ((index >> (3 * k + c)) & 1) << (7 - k)
        colors.append(tuple(rgb))
    return tuple(colors)


def _lookup(dataset: str) -> Tuple[int, str, Optional[RGB]]:
    if not isinstance(dataset, str) or dataset.lower() not in _DATASETS:
        raise ValueError(f"unknown dataset {dataset!r} for a palette; known: {', '.join(PALETTE_NAMES)}")
    return _DATASETS[dataset.lower()]


def get_palette(dataset: str) -> Palette:
    """Class colours of a dataset, one ``(r, g, b)`` per class id (immutable, safe as a class attribute).

    Args:
        dataset: one of :data:`PALETTE_NAMES` (e.g. ``"ade20k"``, ``"citys"``, ``"pascal_voc"``, ``"shapes"``).

    Returns:
        A tuple of ``NUM_CLASS`` RGB tuples.

    Example:
        >>> get_palette("citys")[0]   # road
        (128, 64, 128)
    """
    nclass, source, _ = _lookup(dataset)
    return voc_palette()[:nclass] if source == "voc" else _TABLES[source]


def get_ignore_color(dataset: str) -> RGB:
    """Colour of ignored pixels for a dataset (distinct from all its class colours)."""
    _, source, ignore = _lookup(dataset)
    return voc_palette()[IGNORE_INDEX] if source == "voc" else ignore


def _resolve(palette: PaletteLike) -> Tuple[Palette, RGB]:
    """Class colours and ignore colour of a dataset name or of an explicit list of RGB triples."""
    if isinstance(palette, str):
        return get_palette(palette), get_ignore_color(palette)
    colors = tuple(tuple(int(v) for v in color) for color in palette)
    if not colors or any(len(color) != 3 or not all(0 <= v <= 255 for v in color) for color in colors):
        raise ValueError("a palette must be a non-empty sequence of (r, g, b) triples with values in [0, 255]")
    if len(colors) >= IGNORE_INDEX:
        raise ValueError(f"a palette holds at most {IGNORE_INDEX} classes, got {len(colors)}")
    ignore = next(c for c in [_BLACK, _WHITE] + list(voc_palette()) if c not in colors)
    return colors, ignore


def _as_label_array(mask: Any) -> np.ndarray:
    """An ``HxW`` integer numpy array from a numpy array, tensor or PIL image (a leading 1-dim is squeezed)."""
    if hasattr(mask, "detach"):  # torch.Tensor without importing torch here
        mask = mask.detach().cpu().numpy()
    array = np.asarray(mask)
    while array.ndim > 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2:
        raise ValueError(f"a mask must be HxW (or 1xHxW), got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        if np.issubdtype(array.dtype, np.floating) and np.all(np.mod(array, 1) == 0):
            array = array.astype(np.int64)
        else:
            raise TypeError(f"a mask must hold integer class ids, got dtype {array.dtype}")
    return array


def colorize(mask: Any, dataset: PaletteLike = "pascal_voc") -> Image.Image:
    """Render a label mask as a palettised PIL image.

    Args:
        mask: ``HxW`` (or ``1xHxW``) class ids as a numpy array, tensor or PIL image; ``-1`` and ``255`` are ignored
            pixels.
        dataset: a dataset name (see :data:`PALETTE_NAMES`) or an explicit sequence of RGB triples.

    Returns:
        A PIL ``"P"`` image: pixel values are the class ids (255 for ignored pixels), the palette holds the class
        colours and the ignore colour at index 255; ``.convert("RGB")`` gives the colours.

    Raises:
        ValueError: a value outside ``[0, NUM_CLASS)`` that is neither ``-1`` nor ``255`` (named in the message).

    Example:
        >>> colorize(np.array([[0, 1], [-1, 2]]), "shapes").convert("RGB").getpixel((0, 1))
        (255, 255, 255)
    """
    colors, ignore = _resolve(dataset)
    labels = _as_label_array(mask)
    ignored = (labels == -1) | (labels == IGNORE_INDEX)
    bad = ~ignored & ((labels < 0) | (labels >= len(colors)))
    if bad.any():
        values = np.unique(labels[bad])[:10].tolist()
        raise ValueError(f"mask values {values} are not class ids of a {len(colors)}-class palette "
                         f"(ignored pixels must be -1 or {IGNORE_INDEX})")
    indices = np.where(ignored, IGNORE_INDEX, labels).astype(np.uint8)
    image = Image.frombytes("P", (indices.shape[1], indices.shape[0]), np.ascontiguousarray(indices).tobytes())
    table = np.zeros((256, 3), dtype=np.uint8)
    table[: len(colors)] = colors
    table[IGNORE_INDEX] = ignore
    image.putpalette(table.ravel().tolist())
    return image


def get_mask_pallete(npimg: Any, dataset: PaletteLike = "detail") -> Image.Image:
    """PyTorch-Encoding's name (and spelling) for :func:`colorize`; the input is never modified."""
    return colorize(npimg, dataset)


def _as_rgb_array(image: Any) -> np.ndarray:
    """``HxWx3`` uint8 from a PIL image, an ``HxWx3`` array or a ``3xHxW`` tensor/array (floats in ``[0, 1]``)."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    if hasattr(image, "detach"):
        image = image.detach().cpu().numpy()
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[0] == 3 and array.shape[-1] != 3:
        array = array.transpose(1, 2, 0)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"image must be a PIL image, HxWx3 or 3xHxW, got shape {array.shape}")
    if np.issubdtype(array.dtype, np.floating):
        array = np.clip(array * 255.0 + 0.5, 0, 255)
    return array.astype(np.uint8)


def overlay(image: Any, mask: Any, dataset: PaletteLike = "pascal_voc", alpha: float = 0.5) -> Image.Image:
    """Blend the colourised mask over an image.

    Args:
        image: PIL image, ``HxWx3`` uint8 array, or ``3xHxW`` tensor/array (floats are taken as ``[0, 1]``).
        mask: ``HxW`` class ids (``-1``/``255`` ignored) of the same height and width.
        dataset: dataset name or explicit palette, as in :func:`colorize`.
        alpha: weight of the mask colours (0 = image only, 1 = mask only).

    Returns:
        An RGB PIL image. Ignored pixels show the image unblended.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    rgb = _as_rgb_array(image).astype(np.float64)
    labels = _as_label_array(mask)
    if labels.shape != rgb.shape[:2]:
        raise ValueError(f"mask of shape {labels.shape} does not match image of size {rgb.shape[:2]}")
    colors = np.asarray(colorize(labels, dataset).convert("RGB"), dtype=np.float64)
    blended = (1.0 - alpha) * rgb + alpha * colors
    ignored = (labels == -1) | (labels == IGNORE_INDEX)
    blended[ignored] = rgb[ignored]
    return Image.fromarray(np.clip(blended + 0.5, 0, 255).astype(np.uint8), mode="RGB")
