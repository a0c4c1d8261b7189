"""Multi-scale, flipped, sliding-window inference (PyTorch-Encoding's ``MultiEvalModule`` semantics).

For every scale ``s`` the image is resized so that its long side is ``ceil(base_size * s)`` (aspect ratio kept).
If that long side fits in ``crop_size`` the image is padded to ``crop_size x crop_size`` (bottom/right, with the
normalized value of a black pixel, ``-mean/std``), evaluated and cropped back. Otherwise it is padded up to at least
``crop_size`` in each dimension and evaluated window by window (``crop_size`` windows every
``int(crop_size * stride_rate)`` pixels, border windows padded), overlapping logits being averaged. Each scale's
logits are resized to the original size; with ``flip`` the horizontally flipped image is evaluated too.

Difference from PyTorch-Encoding: the result is the *mean of the logits* over windows, flips and scales, resized with
``align_corners=False``; PE averaged ``exp(logits + flipped logits)`` over windows, summed over scales and resized with
``align_corners=True``: one scale without overlapping windows gives the same labels, several scales differ at a few
pixels (docs/models.md).

Both modules run ``window_batch`` windows per forward (stacked along the batch dimension; default 1, one at a time)
and add each window's logits into the result in the same order as one at a time: the logits equal those of single
windows up to the kernels' float rounding for another batch size, and the labels are the same.

:class:`SlidingWindow` is the single-scale alternative: mmsegmentation's ``mode='slide'`` (windows shifted inside the
image, no padding, logits averaged by coverage count), or the whole image at once.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ..datasets.transforms import IMAGENET_MEAN, IMAGENET_STD
from ..errors import UsageError
from ..nn.blocks import resize
from ..utils.images import max_pixels
from ..utils.metrics import main_output

__all__ = ["MultiEvalModule", "SlidingWindow", "WindowBatch", "InferenceOptionError", "check_scales", "flip_average",
           "batched_windows"]


class InferenceOptionError(UsageError):
    """A window / stride / window batch / scale that inference cannot use, or a size it needs that ``model.info``
    lacks (one line naming the value or the size and the argument to pass; scripts exit with status 2). Also
    ``encoding.inference.predict.InferenceOptionError``."""

    exit_status = 2


def check_scales(scales: Any) -> Tuple[float, ...]:
    """``scales`` as a tuple of floats, each a finite number above 0 (a scale multiplies ``base_size``).

    Raises:
        InferenceOptionError: one line naming ``scales`` and the value (no scale at all, a string, a bool, 0, a
            negative, NaN or infinite scale).
    """
    values = tuple(scales) if isinstance(scales, Iterable) and not isinstance(scales, (str, bytes)) else None
    if not values:
        raise InferenceOptionError(f"scales must be a list of numbers above 0, got {str(repr(scales))[:60]}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
            raise InferenceOptionError(f"scales {str(repr(scales))[:60]}: each scale must be a finite number above "
                                       f"0, got {value!r}")
    return tuple(float(v) for v in values)

#: How many windows one forward runs: a positive int, or a function of one window (the input of one window position,
#: ``B x C x h x w``) that returns it (e.g. from a memory budget: :class:`encoding.inference.predict.WindowBudget`),
#: called once per call of the module.
WindowBatch = Union[int, Callable[[Tensor], int]]
Box = Tuple[int, int, int, int]


def flip_average(module: nn.Module, image: Tensor, flip: bool = True) -> Tensor:
    """Main-output logits of ``module(image)`` (at least float32), averaged with those of the horizontally flipped
    image when ``flip``."""
    logits = main_output(module(image))
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if flip:
        logits = (logits + main_output(module(image.flip(-1))).flip(-1)) / 2
    return logits


def batched_windows(module: nn.Module, boxes: Sequence[Box], take: Callable[[Box], Tensor],
                    window_batch: WindowBatch = 1, flip: bool = False) -> Iterator[Tuple[Box, Tensor]]:
    """``(box, logits)`` of every window, in the order of ``boxes``, ``window_batch`` windows per forward.

    Args:
        module: the model (see :func:`flip_average`).
        boxes: ``(top, bottom, left, right)`` of each window; ``take(box)`` is its input, ``B x C x h x w``, every
            window of the same size.
        window_batch: windows per forward (see :data:`WindowBatch`; more than ``len(boxes)`` runs them all at once).
        flip: average each window with its horizontal flip (:func:`flip_average`).

    The windows of one forward are concatenated along the batch dimension (window-major); each window's ``B``
    rows of the output are yielded in order.

    Raises:
        ValueError: a ``window_batch`` (or what its function returns) that is not a positive int.
    """
    if not boxes:
        return
    first = take(boxes[0])
    size = window_batch(first) if callable(window_batch) else window_batch
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"window_batch must be a positive int, got {size!r}")
    rows = first.shape[0]
    for start in range(0, len(boxes), size):
        chunk = boxes[start:start + size]
        inputs = [first if start == 0 and i == 0 else take(box) for i, box in enumerate(chunk)]
        logits = flip_average(module, inputs[0] if len(inputs) == 1 else torch.cat(inputs), flip)
        del inputs
        for i, box in enumerate(chunk):
            yield box, logits[i * rows:(i + 1) * rows]


def scaled_size(h: int, w: int, base_size: int, scale: float) -> Tuple[int, int]:
    """``(height, width)`` of an ``h x w`` image at ``scale`` in :class:`MultiEvalModule`: the long side
    ``ceil(base_size * scale)``, the aspect ratio kept, the short side at least one pixel (a 400 x 1 strip)."""
    long_size = int(math.ceil(base_size * scale))
    if h > w:
        return long_size, max(int(1.0 * w * long_size / h + 0.5), 1)
    return max(int(1.0 * h * long_size / w + 0.5), 1), long_size


def _recorded(module: nn.Module, name: str, given: Any, default: Any) -> Any:
    """``given``, else the evaluation setting ``name`` the module records (its attribute, then its ``info``'s; a
    size must be an int, ``mean`` / ``std`` a list or tuple of numbers: anything else of that name is not one),
    else ``default``."""
    if given is not None:
        return given
    for source in (module, getattr(module, "info", None)):
        value = getattr(source, name, None)
        if name.endswith("_size"):
            usable = isinstance(value, int) and not isinstance(value, bool)
        else:
            usable = isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, (int, float))
                                                                              for v in value)
        if usable:
            return value
    return default


def _count(name: str, value: Any, pe_order: bool = False) -> Any:
    """``value`` as an int when it is a positive whole number (numpy's too), ``None`` as is; otherwise one line naming
    ``name`` and the value (with ``pe_order``: PyTorch-Encoding's positional ``device_ids, flip`` land here).

    Raises:
        TypeError: a bool, a list, a string, a float...
        InferenceOptionError: 0 or a negative int.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        hint = ""
        if pe_order:
            hint = (" (PyTorch-Encoding's positional order was (module, nclass, device_ids, flip, scales): pass flip= "
                    "and scales= by keyword; the evaluator runs on its module's device)")
        raise TypeError(f"MultiEvalModule: {name} must be a positive int, got {value!r}{hint}")
    if value < 1:
        raise InferenceOptionError(f"MultiEvalModule: {name} must be a positive int, got {value!r}")
    return int(value)


class MultiEvalModule(nn.Module):
    """Evaluate a segmentation model over several scales and flips with sliding-window inference.

    Args:
        module: the model; ``module(x)`` returns logits ``B x nclass x h x w`` at its input's size (or a dict with
            ``"out"``). Put it in eval mode.
        nclass: number of classes.
        base_size: long side of the image at scale 1. ``None`` (the default, as ``crop_size``, ``mean`` and ``std``):
            what the module records, as PyTorch-Encoding read it: its attribute of that name (PE's ``BaseNet``
            stores ``base_size`` / ``crop_size`` / ``mean`` / ``std``; PE's ``test.py --model-zoo`` assigns
            ``model.base_size = ...``), else its ``info`` (:class:`~encoding.inference.ModelInfo`, given by
            :func:`encoding.load_model`), else 520 (``crop_size`` 480, ``mean`` / ``std`` ImageNet's). A value
            given here always wins.
        crop_size: window size (and the size small images are padded to).
        scales: resize factors relative to ``base_size``.
        flip: also evaluate the horizontally flipped image.
        stride_rate: window stride as a fraction of ``crop_size`` (PyTorch-Encoding's ``int(crop_size * rate)``).
        stride: the window stride in pixels, instead of ``stride_rate`` (a rate would round ``S / crop_size`` back to
            ``S - 1`` for many ``S``).
        mean: per-channel normalization mean of the input (for the padding value ``-mean/std``); ``None``: see
            ``base_size``.
        std: per-channel normalization std of the input; ``None``: see ``base_size``.
        window_batch: windows per forward (an int, or a function of one window: :data:`WindowBatch`).
        device_ids: PyTorch-Encoding's ``DataParallel`` devices (its 3rd positional parameter): only ``None``; the
            module runs on its own device (several: :func:`encoding.engine.evaluate_images`).

    Raises:
        TypeError: ``nclass``, ``base_size``, ``crop_size`` or ``stride`` not an int (a bool, a list: PE's positional
            ``device_ids, flip`` are refused, naming PE's order).
        InferenceOptionError: such a size not positive, ``stride_rate`` outside ``(0, 1]``, a bad scale, or
            ``device_ids`` given.

    Shape:
        - Input: normalized images ``B x C x H x W`` (any size; all images of the batch share it).
        - Output: averaged logits ``B x nclass x H x W``, on the input's device, computed without autograd.

    Memory: ``window_batch`` windows (and then their flips) are evaluated at a time; only the current scale's
    accumulated logits and the running sum are held, on the image's device.

    Example:
        >>> evaluator = MultiEvalModule(model.eval(), nclass=21, base_size=520, crop_size=480)
        >>> prediction = evaluator(image).argmax(1)
    """

    def __init__(self, module: nn.Module, nclass: int, base_size: Optional[int] = None,
                 crop_size: Optional[int] = None, scales: Sequence[float] = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75),
                 flip: bool = True, stride_rate: float = 2.0 / 3.0, mean: Optional[Sequence[float]] = None,
                 std: Optional[Sequence[float]] = None, window_batch: WindowBatch = 1,
                 stride: Optional[int] = None, *, device_ids: None = None) -> None:
        super().__init__()
        if device_ids is not None:
            raise InferenceOptionError(
                f"MultiEvalModule(device_ids={device_ids!r}): PyTorch-Encoding's devices are not taken here; the "
                "evaluator runs on its module's device (model.to(device)); for one image per device use "
                "encoding.engine.evaluate_images(evaluator, loader, metric, devices=[...])")
        nclass = _count("nclass", nclass)
        base_size = _count("base_size", _recorded(module, "base_size", _count("base_size", base_size, True), 520))
        crop_size = _count("crop_size", _recorded(module, "crop_size", _count("crop_size", crop_size, True), 480))
        mean = _recorded(module, "mean", mean, IMAGENET_MEAN)
        std = _recorded(module, "std", std, IMAGENET_STD)
        scales = check_scales(scales)
        if isinstance(stride_rate, bool) or not isinstance(stride_rate, numbers.Real) or not 0 < stride_rate <= 1:
            raise InferenceOptionError(f"stride_rate must be a number in (0, 1], got {stride_rate!r}")
        if len(mean) != len(std):
            raise ValueError(f"mean and std must have the same length, got {len(mean)} and {len(std)}")
        self.module = module
        self.nclass = nclass
        self.base_size, self.crop_size = base_size, crop_size
        self.scales = scales
        self.flip = flip
        stride = _count("stride", stride)
        if stride is not None and stride > crop_size:
            raise InferenceOptionError(f"stride must be in [1, crop_size={crop_size}], got {stride}")
        self.stride = stride or max(int(crop_size * stride_rate), 1)
        self.pad_value = tuple(-m / s for m, s in zip(mean, std))
        self.window_batch = window_batch

    @torch.no_grad()
    def forward(self, image: Tensor) -> Tensor:
        if image.dim() != 4 or image.shape[1] != len(self.pad_value):
            raise ValueError(f"MultiEvalModule expects B x {len(self.pad_value)} x H x W images, "
                             f"got shape {tuple(image.shape)}")
        h, w = image.shape[-2:]
        self._check_pixels(h, w)
        scores = None
        for scale in self.scales:
            size = self._scaled_size(h, w, scale)
            score = resize(self._evaluate_scale(resize(image, size)), (h, w))
            scores = score.contiguous() if scores is None else scores.add_(score)  # ours to add into
        return scores.div_(len(self.scales))

    def parallel_forward(self, inputs: Sequence[Tensor]) -> List[Tensor]:
        """PyTorch-Encoding's per-image call (its ``test.py``): ``inputs`` a list of ``3 x H x W`` images of any
        sizes, each evaluated on the module's device; returns their ``1 x nclass x H x W`` logits (PE ran one
        image per GPU; here they run in turn)."""
        device = next(self.module.parameters(), torch.empty(0)).device
        return [self(image.unsqueeze(0).to(device)) for image in inputs]

    def _scaled_size(self, h: int, w: int, scale: float) -> Tuple[int, int]:
        return scaled_size(h, w, self.base_size, scale)

    def _check_pixels(self, h: int, w: int) -> None:
        """Refuse scales whose largest resized ``h x w`` image is over the pixel limit
        (:func:`~encoding.utils.images.max_pixels`), before anything is allocated at that size."""
        scale = max(self.scales)
        height, width = self._scaled_size(h, w, scale)
        if height * width > max_pixels():
            raise InferenceOptionError(
                f"scales {self.scales!r}: the {h} x {w} image at scale {scale:g} (long side base_size {self.base_size} "
                f"x {scale:g}) is {height} x {width} = {height * width:,} pixels, over the pixel limit of "
                f"{max_pixels():,} (smaller scales, or raise the limit with ENCODING_MAX_PIXELS)")

    def _evaluate_scale(self, image: Tensor) -> Tensor:
        """Logits of the whole (resized) image, by one padded pass or by sliding windows."""
        height, width = image.shape[-2:]
        crop = self.crop_size
        if max(height, width) <= crop:
            return self._infer(self._pad(image, crop, crop))[..., :height, :width]
        padded = self._pad(image, max(height, crop), max(width, crop))
        ph, pw = padded.shape[-2:]
        dtype = torch.promote_types(image.dtype, torch.float32)
        logits = image.new_zeros(image.shape[0], self.nclass, ph, pw, dtype=dtype)
        count = image.new_zeros(1, 1, ph, pw, dtype=dtype)
        boxes = [(h0, min(h0 + crop, ph), w0, min(w0 + crop, pw))
                 for h0 in self._window_starts(ph) for w0 in self._window_starts(pw)]

        def take(box: Box) -> Tensor:
            return self._pad(padded[..., box[0]:box[1], box[2]:box[3]], crop, crop)

        for (h0, h1, w0, w1), out in batched_windows(self.module, boxes, take, self.window_batch, self.flip):
            logits[..., h0:h1, w0:w1] += self._checked(out)[..., :h1 - h0, :w1 - w0]
            count[..., h0:h1, w0:w1] += 1
        return logits.div_(count)[..., :height, :width]

    def _window_starts(self, length: int) -> range:
        grids = int(math.ceil((length - self.crop_size) / self.stride)) + 1
        return range(0, grids * self.stride, self.stride)

    def _pad(self, image: Tensor, height: int, width: int) -> Tensor:
        """Pad bottom/right to ``height x width`` with the per-channel value of a black pixel."""
        h, w = image.shape[-2:]
        if h >= height and w >= width:
            return image
        value = torch.tensor(self.pad_value, dtype=image.dtype, device=image.device)
        padded = value.view(1, -1, 1, 1).expand(image.shape[0], -1, height, width).clone()
        padded[..., :h, :w] = image
        return padded

    def _infer(self, image: Tensor) -> Tensor:
        """Logits of one padded window (at least float32), averaged with those of its horizontal flip."""
        return self._checked(flip_average(self.module, image, self.flip))

    def _checked(self, logits: Tensor) -> Tensor:
        """``logits``, refused unless they have ``nclass`` channels (a binary network's one channel would be
        broadcast into two equal ones)."""
        if logits.dim() != 4 or logits.shape[1] != self.nclass:
            raise ValueError(f"MultiEvalModule(nclass={self.nclass}): the network returns logits of shape "
                             f"{tuple(logits.shape)}; nclass must be its number of output channels (1 for a binary "
                             "network's one foreground channel)")
        return logits


class SlidingWindow(nn.Module):
    """Single-scale inference by overlapping windows: mmsegmentation's ``mode='slide'`` (or the whole image at once).

    Windows of ``window`` pixels start every ``stride`` pixels; the last window of a row or column is shifted back to
    end at the image's border (``ceil((size - window) / stride) + 1`` windows per dimension), so no window is padded
    and each pixel's logits are the mean over the windows that cover it. An image no larger than the window in a
    dimension is taken whole in that dimension: with ``window`` at least the image size, the result is the model's
    output on the whole image.

    Args:
        module: the model; ``module(x)`` returns logits at its input's size (or a dict with ``"out"``), in eval mode.
        window: window size ``(height, width)`` or one int; ``None``: the whole image in one pass.
        stride: distance between window starts (default: two thirds of the window, mmsegmentation's 512 / 341).
        flip: average each window's logits with those of its horizontal flip.
        window_batch: windows per forward (an int, or a function of one window: :data:`WindowBatch`).

    Shape:
        - Input: ``B x C x H x W`` (any size).
        - Output: logits ``B x nclass x H x W`` (at least float32), computed without autograd.

    Memory: the result (``B x nclass x H x W`` floats, accumulated in place), a ``H x W`` count, and
    ``window_batch`` windows' inputs and outputs (and the model's activations on them).

    Raises:
        ValueError: a window or stride that is not a positive int, or a stride larger than the window.
    """

    def __init__(self, module: nn.Module, window: Optional[Union[int, Sequence[int]]] = None,
                 stride: Optional[Union[int, Sequence[int]]] = None, flip: bool = False,
                 window_batch: WindowBatch = 1) -> None:
        super().__init__()
        self.module, self.flip, self.window_batch = module, flip, window_batch
        self.window = None if window is None else _pair(window, "window")
        if stride is None and self.window is not None:
            stride = tuple(max(w * 2 // 3, 1) for w in self.window)
        self.stride = None if stride is None else _pair(stride, "stride")
        if self.window is None and stride is not None:
            raise ValueError(f"stride {stride!r} needs a window")
        if self.window is not None and any(s > w for s, w in zip(self.stride, self.window)):
            raise ValueError(f"stride {stride!r} is larger than the window {window!r}: the pixels between two windows "
                             "would be covered by none; use a stride of at most the window")

    @torch.no_grad()
    def forward(self, image: Tensor) -> Tensor:
        if self.window is None:
            return flip_average(self.module, image, self.flip)
        height, width = image.shape[-2:]
        boxes = [(top, bottom, left, right) for top, bottom in _windows(height, self.window[0], self.stride[0])
                 for left, right in _windows(width, self.window[1], self.stride[1])]
        logits = count = None
        for (top, bottom, left, right), out in batched_windows(
                self.module, boxes, lambda box: image[..., box[0]:box[1], box[2]:box[3]], self.window_batch,
                self.flip):
            if logits is None:
                logits = out.new_zeros(*out.shape[:2], height, width)
                count = out.new_zeros(1, 1, height, width)
            logits[..., top:bottom, left:right] += out
            count[..., top:bottom, left:right] += 1
        return logits.div_(count)  # in place: the result is the only full-size copy of the logits


def _pair(value: Union[int, Sequence[int]], name: str) -> Tuple[int, int]:
    """``value`` (an int, numpy's too, or ``(height, width)``) as two Python ints, each positive."""
    pair = (value, value) if isinstance(value, numbers.Integral) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in pair):
        raise ValueError(f"{name} must be a positive int or (height, width), got {value!r}")
    return int(pair[0]), int(pair[1])


def _windows(size: int, window: int, stride: int) -> List[Tuple[int, int]]:
    """``(start, end)`` of the windows along one dimension (mmsegmentation's grid: the last one ends at ``size``)."""
    grids = max(size - window + stride - 1, 0) // stride + 1
    return [(max(min(i * stride + window, size) - window, 0), min(i * stride + window, size)) for i in range(grids)]
