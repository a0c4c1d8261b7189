"""Render label masks as images: :func:`colorize`, :func:`overlay`, and the PASCAL VOC colour map.

The colours belong to the datasets: every dataset class carries ``PALETTE`` (one RGB triple per class) and
``IGNORE_COLOR`` (the colour of ignored pixels, distinct from every class colour). The functions here take either a
dataset name or an explicit sequence of RGB triples. The names are those :func:`register_palettes` was given:
:mod:`encoding.datasets` registers its registry (:data:`encoding.datasets.datasets`) when it is imported, so this
module imports no dataset; ``"detail"``, PyTorch-Encoding's name of the VOC colour map, means ``pcontext``.
:func:`colorize` stores the mask as a PIL ``"P"`` image whose index 255 is the ignore colour, so saved PNGs keep the
class ids as pixel values. PyTorch-Encoding's ``get_mask_pallete`` is declared for this module
in ``encoding/legacy/helpers.py``.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

import numpy as np
from PIL import Image

__all__ = [
    "PALETTE_NAMES",
    "register_palettes",
    "get_palette",
    "get_ignore_color",
    "voc_palette",
    "generated_palette",
    "palette_of",
    "colorize",
    "overlay",
]

RGB = Tuple[int, int, int]
Palette = Tuple[RGB, ...]
PaletteLike = Union[str, Sequence[Sequence[int]]]

_IGNORE_SLOT = 255  # palette index of ignored pixels in the "P" images (not a label value)
_ALIASES = {"detail": "pcontext"}  # PyTorch-Encoding's default name for the VOC colour map
_BLACK: RGB = (0, 0, 0)
_WHITE: RGB = (255, 255, 255)


def _interleaved(index: int) -> RGB:
    """The VOC bit interleave of any id below ``2 ** 24``: bit ``3k + c`` of ``index`` becomes bit ``7 - k`` of
    channel ``c`` (a one-to-one map of the 24-bit ids onto the 24-bit colours)."""
    rgb = [0, 0, 0]
    for k in range(8):
        for c in range(3):
            rgb[c] |= ((index >> (3 * k + c)) & 1) << (7 - k)
    return rgb[0], rgb[1], rgb[2]


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
    return tuple(_interleaved(index) for index in range(num))


@lru_cache(maxsize=None)
def generated_palette(num: int) -> Palette:
    """Distinct colours for ``num`` classes of a dataset that declares none (``PALETTE = None``, a folder dataset
    without class colours): the first ``num`` colours of :func:`voc_palette`, and past 256 classes the same bit
    interleave continued over more bits of the class id (every colour distinct, up to ``2 ** 24`` classes).

    Example:
        >>> generated_palette(3)
        ((0, 0, 0), (128, 0, 0), (0, 128, 0))
    """
    if not 0 < num <= 1 << 24:
        raise ValueError(f"a generated palette needs 1 to {1 << 24} classes, got {num}")
    return voc_palette(num) if num <= 256 else voc_palette(256) + tuple(_interleaved(i) for i in range(256, num))


def palette_of(source: Any) -> Palette:
    """The class colours of a dataset class or instance: its ``PALETTE``, or :func:`generated_palette` of its
    ``NUM_CLASS`` / ``CLASSES`` when it declares none."""
    palette = getattr(source, "PALETTE", None)
    if palette is not None:
        return tuple(tuple(int(v) for v in c) for c in palette)
    return generated_palette(int(getattr(source, "NUM_CLASS", 0) or len(getattr(source, "CLASSES", ()))))


#: Name -> an object carrying ``PALETTE`` and ``IGNORE_COLOR`` (a dataset class), filled by :func:`register_palettes`.
_SOURCES: Dict[str, Any] = {}
#: The names :func:`get_palette` and :func:`colorize` accept: the registered dataset names, then PE's ``detail``
#: (kept up to date in place by :func:`register_palettes`).
PALETTE_NAMES: List[str] = list(_ALIASES)


def register_palettes(registry: Mapping[str, Any]) -> None:
    """Make the colours of ``registry``'s entries (name -> object with ``PALETTE`` / ``IGNORE_COLOR``) known by name.

    The colours are read from the objects when asked for, so a class's own ``PALETTE`` stays the one source.

    Args:
        registry: e.g. :data:`encoding.datasets.datasets` (which registers itself when imported).
    """
    _SOURCES.update((name.lower(), source) for name, source in registry.items()
                    if getattr(source, "PALETTE", None) is not None)  # a folder dataset's colours are its own
    PALETTE_NAMES[:] = list(_SOURCES) + [alias for alias in _ALIASES if alias not in _SOURCES]


def _dataset_class(dataset: str) -> Any:
    """The registered dataset class whose ``PALETTE`` / ``IGNORE_COLOR`` a name refers to."""
    key = _ALIASES.get(dataset.lower(), dataset.lower()) if isinstance(dataset, str) else None
    cls = _SOURCES.get(key)
    if cls is None or cls.PALETTE is None:
        raise ValueError(f"unknown dataset {dataset!r} for a palette; known: {', '.join(PALETTE_NAMES)}")
    return cls


def get_palette(dataset: str) -> Palette:
    """Class colours of a dataset, one ``(r, g, b)`` per class id: its class's ``PALETTE``.

    Args:
        dataset: a registered dataset name (e.g. ``"ade20k"``, ``"citys"``, ``"pascal_voc"``, ``"shapes"``), any
            case; see ``PALETTE_NAMES``.

    Returns:
        A tuple of ``NUM_CLASS`` RGB tuples.

    Example:
        >>> get_palette("citys")[0]   # road
        (128, 64, 128)
    """
    return _dataset_class(dataset).PALETTE


def get_ignore_color(dataset: str) -> RGB:
    """Colour of ignored pixels for a dataset (distinct from all its class colours): its class's ``IGNORE_COLOR``."""
    return _dataset_class(dataset).IGNORE_COLOR


def _resolve(palette: PaletteLike) -> Tuple[Palette, RGB]:
    """Class colours and ignore colour of a dataset name or of an explicit list of RGB triples."""
    if isinstance(palette, str):
        return get_palette(palette), get_ignore_color(palette)
    colors = tuple(tuple(int(v) for v in color) for color in palette)
    if not colors or any(len(color) != 3 or not all(0 <= v <= 255 for v in color) for color in colors):
        raise ValueError("a palette must be a non-empty sequence of (r, g, b) triples with values in [0, 255]")
    if len(colors) >= _IGNORE_SLOT:  # one "P" image index per class, index 255 is the ignore colour
        raise ValueError(f"cannot colourise {len(colors)} classes: a palettised PNG holds at most {_IGNORE_SLOT - 1} "
                         f"class colours (index {_IGNORE_SLOT} is the ignore colour)")
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
    ignored = (labels == -1) | (labels == _IGNORE_SLOT)
    bad = ~ignored & ((labels < 0) | (labels >= len(colors)))
    if bad.any():
        values = np.unique(labels[bad])[:10].tolist()
        raise ValueError(f"mask values {values} are not class ids of a {len(colors)}-class palette "
                         f"(ignored pixels must be -1 or {_IGNORE_SLOT})")
    indices = np.where(ignored, _IGNORE_SLOT, labels).astype(np.uint8)
    image = Image.frombytes("P", (indices.shape[1], indices.shape[0]), np.ascontiguousarray(indices).tobytes())
    table = np.zeros((256, 3), dtype=np.uint8)
    table[: len(colors)] = colors
    table[_IGNORE_SLOT] = ignore
    image.putpalette(table.ravel().tolist())
    return image


def _as_rgb_array(image: Any, size: Any = None) -> np.ndarray:
    """``HxWx3`` uint8 from a PIL image, an ``HxWx3`` array or a ``3xHxW`` tensor/array (floats in ``[0, 1]``).

    A tensor with 3 leading channels is ``3xHxW`` (torch's layout) even when it is 3 pixels wide; an array of shape
    ``3xHx3`` is read as the layout that gives ``size`` (the mask's ``(H, W)``) when given."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    channels_first = hasattr(image, "detach") and image.ndim == 3 and image.shape[0] == 3
    if hasattr(image, "detach"):
        image = image.detach().cpu().numpy()
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[0] == 3 and (channels_first or array.shape[-1] != 3
                                                    or (size is not None and tuple(array.shape[1:]) == tuple(size))):
        array = array.transpose(1, 2, 0)
    if array.ndim != 3 or array.shape[-1] != 3:
        raise ValueError(f"image must be a PIL image, HxWx3 or 3xHxW, got shape {array.shape}")
    if np.issubdtype(array.dtype, np.floating):
        array = np.clip(array * 255.0 + 0.5, 0, 255)
    return array.astype(np.uint8)


def overlay(image: Any, mask: Any, dataset: PaletteLike = "pascal_voc", alpha: float = 0.5,
            unblended: Sequence[int] = ()) -> Image.Image:
    """Blend the colourised mask over an image.

    Args:
        image: PIL image, ``HxWx3`` uint8 array, or ``3xHxW`` tensor/array (floats are taken as ``[0, 1]``).
        mask: ``HxW`` class ids (``-1``/``255`` ignored) of the same height and width.
        dataset: dataset name or explicit palette, as in :func:`colorize`.
        alpha: weight of the mask colours (0 = image only, 1 = mask only).
        unblended: class ids whose pixels show the image unblended (e.g. ``(0,)``: the background class, black in
            the VOC colours, would otherwise darken the whole photo).

    Returns:
        An RGB PIL image. Ignored pixels and the ``unblended`` classes show the image unblended.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    labels = _as_label_array(mask)
    rgb = _as_rgb_array(image, labels.shape).astype(np.float64)
    if labels.shape != rgb.shape[:2]:
        raise ValueError(f"mask of shape {labels.shape} does not match image of size {rgb.shape[:2]}")
    colors = np.asarray(colorize(labels, dataset).convert("RGB"), dtype=np.float64)
    blended = (1.0 - alpha) * rgb + alpha * colors
    ignored = (labels == -1) | (labels == _IGNORE_SLOT) | np.isin(labels, list(unblended))
    blended[ignored] = rgb[ignored]
    return Image.fromarray(np.clip(blended + 0.5, 0, 255).astype(np.uint8), mode="RGB")
