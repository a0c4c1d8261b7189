"""What the Segment tab computes, without Gradio: an image's labels by :func:`encoding.segment` (whole, by sliding
windows or multi-scale, with or without flip), the overlay and the legend of the classes present beside it (made by
:mod:`.rendering`), the mask PNG and each class's share of the image.

An image file is checked from its header before a pixel is decoded (:func:`encoding.utils.images.open_image`: at most
``--max-pixels`` pixels).

The labels are ``encoding.segment``'s, so an image of any size keeps its bounded memory (see
:func:`encoding.inference.predict.segment`); the colours and names are the network's
(:class:`~encoding.inference.ModelInfo`, from its checkpoint). A visitor's windows, stride and scales are bounded
before any work (:func:`check_request`, :func:`check_work`).
"""
from __future__ import annotations

import argparse
import html
import inspect
import io
import os
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image
from torch import nn

from ..datasets.base import read_rgb
from ..inference.loading import ModelInfo, model_info
from ..inference.predict import segment
from ..models.multieval import scaled_size
from ..errors import UsageError
from ..utils.cli import scales
from ..utils.files import atomic_write
from ..utils.images import ImageTooLarge, check_pixels, max_pixels, open_image
from ..utils.palette import colorize
from .rendering import blend, present_legend_html

__all__ = ["MODES", "SegmentRequest", "Segmentation", "parse_scales", "BYTES_PER_PIXEL", "upload_limit",
           "check_image_size", "check_request", "check_work", "MAX_SCALES", "MIN_WINDOW", "min_window", "segment_image",
           "class_shares", "legend_html", "write_mask", "validation_images"]

#: The Segment tab's choices: the whole image at once, overlapping windows, several scales (PyTorch-Encoding's
#: multi-scale evaluation, :class:`~encoding.models.MultiEvalModule`).
MODES = ("whole", "slide", "multi-scale")


@dataclass(frozen=True)
class SegmentRequest:
    """How to segment: ``mode`` (:data:`MODES`), ``flip``, the windows of ``slide`` / ``multi-scale`` (``None``:
    the training crop, two thirds of it) and the scales of ``multi-scale``."""

    mode: str = "whole"
    flip: bool = False
    window: Optional[int] = None
    stride: Optional[int] = None
    scales: Tuple[float, ...] = (0.75, 1.0, 1.25)

    def keywords(self) -> dict:
        """The keywords of :func:`encoding.segment` that do this.

        Raises:
            UsageError: an unknown mode.
        """
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}; valid: {', '.join(MODES)}")
        windows = dict(window=self.window, stride=self.stride)  # in mode "whole": refused (check_request)
        if self.mode == "multi-scale":
            return dict(mode="whole", scales=list(self.scales), flip=self.flip, **windows)
        return dict(mode=self.mode, flip=self.flip, **windows)


@dataclass
class Segmentation:
    """One image segmented: ``labels`` (``H x W`` int64), the ``overlay`` (``H x W x 3`` uint8: the image blended
    with the class colours, :func:`~.rendering.blend`), the palettised ``mask`` (pixel values = class ids),
    ``shares`` (one ``(class name, colour, pixels, fraction)`` per class present, largest first) and ``legend``
    (those classes as HTML, shown beside the image)."""

    labels: torch.Tensor
    overlay: np.ndarray
    mask: Image.Image
    shares: List[Tuple[str, Tuple[int, int, int], int, float]]
    legend: str


def parse_scales(text: str) -> Tuple[float, ...]:
    """``"0.75, 1, 1.25"`` -> ``(0.75, 1.0, 1.25)``: the ``--scales`` option's parsing
    (:func:`encoding.utils.cli.scales`), its refusal as a page message.

    Raises:
        UsageError: an empty list, a value that is not a number or not positive.
    """
    try:
        return scales(str(text))
    except argparse.ArgumentTypeError as err:
        raise UsageError(f"scales: {err} (such as 0.75,1,1.25)") from None


#: The largest image file the page takes, per pixel of ``--max-pixels``: an uncompressed 16-bit RGBA image has 8
#: bytes a pixel, so no image the page reads is refused for its file size.
BYTES_PER_PIXEL = 8


def upload_limit() -> int:
    """The most bytes an image sent to the page may take, uploaded (Gradio refuses a larger file before storing it)
    or inline (:func:`~.segment_tab.image_input`): :data:`BYTES_PER_PIXEL` per pixel of the pixel limit."""
    return BYTES_PER_PIXEL * max_pixels()


def check_image_size(path: str) -> None:
    """Refuse the image file ``path`` above the pixel limit (:func:`encoding.utils.images.max_pixels`, the page's
    ``--max-pixels``) from its header, before a pixel is decoded.

    Raises:
        ImageTooLarge: too many pixels (one line naming the file by its name, not the server's folder).
        UsageError: a file that is no image (its header is not one).
    """
    name = os.path.basename(path)
    try:
        with warnings.catch_warnings():  # Pillow's decompression-bomb warning: the limit below says it in one line
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with open_image(path):
                pass
    except ImageTooLarge as err:
        raise ImageTooLarge(str(err).replace(path, repr(name), 1)) from None
    except (OSError, ValueError) as err:
        raise UsageError(f"{name!r} is not an image this page can read ({_reason(err, path)})") from None


def _reason(err: BaseException, path: str) -> str:
    return (str(err).splitlines()[0] if str(err) else type(err).__name__).replace(path, "the file")


def _image_array(image: object) -> np.ndarray:
    """``image`` (a file path, a PIL image or an ``H x W x 3`` uint8 array) as the datasets read it; a file is
    checked from its header first (:func:`check_image_size`).

    Raises:
        ImageTooLarge: more pixels than the limit. UsageError: no image, an unreadable file, or an image without
            pixels (the message names it).
    """
    if image is None:
        raise UsageError("no image: upload one first")
    if isinstance(image, (str, os.PathLike)):
        path = os.fspath(image)
        check_image_size(path)
        try:
            array = read_rgb(path)
        except (OSError, ValueError) as err:  # DatasetError is a ValueError
            raise UsageError(f"{os.path.basename(path)!r} is not an image this page can read "
                             f"({_reason(err, path)})") from None
    else:
        array = np.asarray(image.convert("RGB") if isinstance(image, Image.Image) else image)
    if array.ndim != 3 or array.shape[0] == 0 or array.shape[1] == 0:
        raise UsageError(f"the image has no pixels (size {array.shape[1] if array.ndim > 1 else 0} x "
                         f"{array.shape[0]}): nothing to segment")
    check_pixels(array.shape[1], array.shape[0], "the image")
    return array


def segment_image(model: nn.Module, image: object, request: SegmentRequest = SegmentRequest()) -> Segmentation:
    """Segment ``image`` with ``model`` (loaded by :func:`encoding.load_model`) as ``request`` says.

    Returns:
        The :class:`Segmentation`; its labels are ``encoding.segment(model, image, **request.keywords())``.

    Raises:
        ImageTooLarge: an image above the pixel limit (a file: from its header, nothing decoded).
        UsageError: no image, an unreadable one, one without pixels, an unknown mode. ValueError: windows that
            ``encoding.segment`` refuses (a stride larger than the window).
    """
    info = model_info(model)
    keywords = request.keywords()
    check_request(request, info)  # the windows, before the image is read
    array = _image_array(image)
    check_work(request, array.shape[0], array.shape[1], info)
    labels = segment(model, array, **keywords)
    shares = class_shares(labels, info)
    return Segmentation(labels, blend(array, labels, info), colorize(labels, info.palette), shares,
                        present_legend_html(shares))


#: The most scales a visitor's multi-scale request may hold.
MAX_SCALES = 8
#: The smallest window of a network without a training crop (pixels); with one, half of it (:func:`min_window`).
MIN_WINDOW = 32


def min_window(info: ModelInfo) -> int:
    """The smallest window the page runs for the network of ``info``: half its training crop (rounded up; the
    default window, the crop itself, is always taken), else :data:`MIN_WINDOW`. Each window costs a forward's fixed
    work besides its pixels: 2 x 2 windows (stride 1) took 49 times a whole-image pass on a 400 x 400 image, and
    windows of half the crop at a quarter of their size apart 9 times (a quarter of the crop: 18 times)."""
    return -(-info.crop_size // 2) if info.crop_size else MIN_WINDOW


def check_request(request: SegmentRequest, info: ModelInfo) -> None:
    """Refuse, before the image is read, a visitor's windows that would make the page work past its pixel limit
    (``--max-pixels``) or far past a whole-image pass: a window above the limit; a window under :func:`min_window`
    (half the training crop: many small windows cost far more than their pixels); a stride under a quarter of the
    window (each pixel seen more than 16 times); more than :data:`MAX_SCALES` scales.

    Raises:
        ImageTooLarge: a window above the limit. UsageError: the window, the stride or the scales.
    """
    if request.mode == "whole":
        if request.window is not None or request.stride is not None:
            raise UsageError("window / stride: options of mode slide / multi-scale, not of mode whole")
        return
    smallest = min_window(info)
    if request.window is not None and request.window < smallest:
        raise UsageError(f"window {request.window}: at least {smallest} pixels for this network (half its training "
                         f"crop {info.crop_size})" if info.crop_size else
                         f"window {request.window}: at least {smallest} pixels")
    window = request.window or info.crop_size
    if window:  # none: encoding.segment says the network has no training crop
        check_pixels(window, window, f"window {window}")
        if request.stride is not None and request.stride < window / 4:
            raise UsageError(f"stride {request.stride}: at least a quarter of the window ({-(-window // 4)} for "
                             f"window {window}); a smaller one evaluates each pixel more than 16 times")
    if request.mode == "multi-scale" and len(request.scales) > MAX_SCALES:
        raise UsageError(f"scales: {len(request.scales)} given, at most {MAX_SCALES}")


def check_work(request: SegmentRequest, height: int, width: int, info: ModelInfo) -> None:
    """Once the image is read (after :func:`check_request`), for its ``height x width`` the multi-scale sizes: the
    image at a scale (padded to the window) above the pixel limit is refused.

    Raises:
        ImageTooLarge: a scaled image above the limit.
    """
    if request.mode != "multi-scale" or not info.base_size:
        return
    window = request.window or info.crop_size or 0
    for scale in request.scales:  # MultiEvalModule's sizes, padded to the window
        h, w = scaled_size(height, width, info.base_size, scale)
        check_pixels(max(w, window), max(h, window), f"the image at scale {scale:g}")


def class_shares(labels: torch.Tensor, info: ModelInfo) -> List[Tuple[str, Tuple[int, int, int], int, float]]:
    """Each class present in ``labels``: its name, colour, pixel count and fraction of the image, largest first."""
    counts = torch.bincount(labels.reshape(-1), minlength=info.num_classes)
    total = int(labels.numel())
    present = [(int(c), int(n)) for c, n in enumerate(counts.tolist()) if n > 0]
    present.sort(key=lambda item: (-item[1], item[0]))
    return [(_name(info, c), _colour(info, c), n, n / total) for c, n in present]


def _name(info: ModelInfo, cls: int) -> str:
    return info.classes[cls] if cls < info.num_classes else f"class {cls}"


def _colour(info: ModelInfo, cls: int) -> Tuple[int, int, int]:
    return tuple(info.palette[cls]) if cls < len(info.palette) else (0, 0, 0)


def legend_html(info: ModelInfo, present: Sequence[int] = ()) -> str:
    """The network's classes as HTML: a colour swatch and the name of each (the ``present`` ones in bold)."""
    items = []
    for cls, name in enumerate(info.classes):
        r, g, b = _colour(info, cls)
        label = f"<b>{html.escape(name)}</b>" if cls in present else html.escape(name)
        items.append(f'<span style="display:inline-block;margin:2px 10px 2px 0"><span style="display:inline-block;'
                     f'width:12px;height:12px;background:rgb({r},{g},{b});border:1px solid #000;'
                     f'vertical-align:middle"></span> {label}</span>')
    return f'<div class="encoding-legend">{"".join(items)}</div>'


def write_mask(mask: Image.Image, path: str) -> str:
    """Write the palettised mask PNG to ``path`` atomically; returns ``path``."""
    buffer = io.BytesIO()
    mask.save(buffer, format="PNG")
    atomic_write(path, buffer.getvalue())
    return path


def validation_images(dataset: str, root: Optional[str] = None, limit: int = 12, **options: object) -> List[str]:
    """Up to ``limit`` validation images of the registered ``dataset`` when they are on disk under ``root`` (default
    ``$ENCODING_DATA`` or ``~/.encoding/data``): the page's examples. Nothing is generated or downloaded; ``[]``
    for a dataset that is not registered or not there. ``options`` go to the dataset (e.g. ``shapes``' sizes)."""
    from ..datasets import datasets

    cls = datasets.get(str(dataset).lower(), None)
    if cls is None:
        return []
    if "generate" in inspect.signature(cls.__init__).parameters:
        options = {**options, "generate": False, "progress": False}  # shapes: only the scenes already written
    try:
        data = cls(root=root, split="val", mode="testval", **options)
    except (OSError, ValueError, RuntimeError):  # not there (DatasetError is a ValueError)
        return []
    return list(data.images[:limit])
