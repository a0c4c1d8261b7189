"""Segment images in Python: :func:`segment` (``encoding.segment``) and the inference module behind it and
``test.py`` / ``demo.py`` (:func:`inference_module`).

Three ways to turn an image of any size into logits at its size:

* ``mode="whole"``: one pass over the whole image (the model's output is resized to the input by the model);
* ``mode="slide"``: mmsegmentation's single-scale sliding window (:class:`~encoding.models.SlidingWindow`): windows of
  ``window`` pixels every ``stride`` pixels, logits averaged where they overlap;
* ``scales=(...)``: PyTorch-Encoding's multi-scale evaluation (:class:`~encoding.models.MultiEvalModule`): the image
  resized so that its long side is ``base_size * scale`` for each scale, each scale evaluated by ``crop_size``
  windows (``window`` when given), the logits averaged over scales.

``flip=True`` averages each pass with the horizontally flipped image's.

Windows run in batches (:class:`WindowBudget`): as many per forward as the memory allowed to them holds
(``window_memory``; default :func:`default_window_memory`), or ``window_batch`` of them; the labels are those of one
window at a time.
"""
from __future__ import annotations

import math
import os
import warnings
import weakref
from typing import Dict, Optional, Sequence, Union

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from ..datasets.base import BaseDataset
from ..datasets.transforms import IMAGENET_MEAN, IMAGENET_STD, image_transform
from ..memory.fakes import new_fake_mode
from ..memory.tracker import AllocationTracker
from ..models import MultiEvalModule, SlidingWindow
from ..models.multieval import InferenceOptionError, WindowBatch, flip_average
from ..utils.images import rgb_of
from ..utils.metrics import labels_of, main_output
from .loading import ModelInfo, model_info

__all__ = ["INFERENCE_MODES", "DEFAULT_WINDOW_MEMORY", "InferenceOptionError", "check_windows", "run_device",
           "to_batch", "default_window_memory", "window_bytes", "WindowBudget", "inference_module", "segment"]

#: The values of ``mode``: the whole image at once, or mmsegmentation's sliding window.
INFERENCE_MODES = ("whole", "slide")

ImageLike = Union[str, os.PathLike, Image.Image, np.ndarray, Tensor]
#: The memory the windows of one forward may take on a CPU, by default (bytes): 64 MiB. More windows per forward than
#: a CPU's caches hold run slower (``benchmarks/bench_slide.py``, docs/inference.md: 86 windows of the main job's
#: network take two thirds of the time the 693 that 512 MiB held took; FCN-ResNet50's 480 px windows, one per
#: forward, 11.6 s against 12.5 s two per forward).
DEFAULT_WINDOW_MEMORY = 64 * 2 ** 20


def check_windows(window: Optional[int], stride: Optional[int]) -> None:
    """Refuse a ``window`` / ``stride`` that is not a positive int (``0`` is no "default"), or a stride larger than
    the window (the pixels between two windows would be covered by none: NaN logits).

    Raises:
        InferenceOptionError: naming the value.
    """
    for name, value in (("window", window), ("stride", stride)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise InferenceOptionError(f"{name} must be a positive number of pixels, got {value!r}")
    if window is not None and stride is not None and stride > window:
        raise InferenceOptionError(f"stride {stride} is larger than the window {window}: the pixels between two "
                                   "windows would be covered by none; use a stride of at most the window")


def default_window_memory(device: Union[str, torch.device]) -> int:
    """The memory the windows of one forward may take on ``device`` by default: :data:`DEFAULT_WINDOW_MEMORY` on a
    CPU, half of the free memory of a CUDA device (``torch.cuda.mem_get_info``)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] // 2
    return DEFAULT_WINDOW_MEMORY


_WINDOW_BYTES: "weakref.WeakKeyDictionary[nn.Module, Dict[tuple, int]]" = weakref.WeakKeyDictionary()


def window_bytes(model: nn.Module, window: Tensor, flip: bool = False) -> int:
    """The peak bytes of one window's forward (its input, the model's activations, its logits; with ``flip`` its
    flip's too), simulated on fake tensors (:class:`~encoding.memory.tracker.AllocationTracker`: no memory allocated,
    no kernel run) in the caller's grad / autocast mode; remembered per model, window shape and mode."""
    model = getattr(model, "_orig_mod", model)  # a torch.compile wrapper: its module's tensors
    key = (tuple(window.shape), window.dtype, window.device, flip, model.training, torch.is_grad_enabled(),
           torch.get_autocast_dtype(window.device.type) if torch.is_autocast_enabled(window.device.type) else None)
    known = _WINDOW_BYTES.setdefault(model, {})
    if key not in known:
        with new_fake_mode(), AllocationTracker() as tracker:  # a compiled network runs its eager code here
            fake = torch.empty(window.shape, dtype=window.dtype, device=window.device)
            tracker.track(fake)
            flip_average(model, fake, flip)
        known[key] = max(tracker.peak, 1)
    return known[key]


class WindowBudget:
    """How many windows one forward runs (a :data:`~encoding.models.multieval.WindowBatch` function): as many as
    ``memory`` bytes hold, by :func:`window_bytes` of the first window (at least 1).

    Args:
        model: the network the windows run through.
        memory: bytes (or ``"2GiB"``) the windows of one forward may take (default: :func:`default_window_memory`
            of the window's device).
        flip: the windows are run with their flips.

    A model the simulation cannot run (fake tensors) gets one window per forward, with a warning saying so.
    """

    def __init__(self, model: nn.Module, memory: Union[None, int, str] = None, flip: bool = False) -> None:
        if memory is not None:
            from ..memory.planner import parse_memory  # the tool's reader of "2GiB", loaded only for a string

            try:
                memory = parse_memory(memory)
            except ValueError as error:
                raise InferenceOptionError(f"window_memory: {error}") from None
        self.model, self.memory, self.flip = model, memory, flip

    def __call__(self, window: Tensor) -> int:
        memory = self.memory or default_window_memory(window.device)
        try:
            return max(1, memory // window_bytes(self.model, window, self.flip))
        except Exception as error:  # noqa: BLE001 - any model fake tensors cannot run: one window at a time
            warnings.warn(f"window batch: the memory of one window could not be simulated ({type(error).__name__}: "
                          f"{str(error).splitlines()[0] if str(error) else ''}); running one window per forward",
                          RuntimeWarning, stacklevel=2)
            return 1


def to_batch(image: ImageLike, mean: Sequence[float] = IMAGENET_MEAN,
             std: Sequence[float] = IMAGENET_STD) -> Tensor:
    """``image`` as a normalised ``float32 B x 3 x H x W`` batch.

    Args:
        image: a path (read by the datasets' reader: EXIF-upright, any mode converted to RGB), a PIL image (read
            as its file would be), an
            ``H x W x 3`` ``uint8`` array (``H x W`` or ``H x W x 1``: grey, its value in each channel, as a grey
            file is read), a ``uint8`` tensor ``3 x H x W`` / ``B x 3 x H x W`` (normalised here), or a
            float tensor ``3 x H x W`` / ``B x 3 x H x W`` taken as already normalised (as the datasets give them),
            returned in its own dtype (:func:`segment` converts it to the model's: :func:`model_dtype`).
        mean, std: the normalisation of ``uint8`` inputs.

    Raises:
        DatasetError: an unreadable image file (the message names it).
        ValueError: any other shape or type (the message says which).
    """
    if isinstance(image, (str, os.PathLike)):
        image = BaseDataset._read_image(os.fspath(image))
    if isinstance(image, Image.Image):
        image = rgb_of(image)  # as its file is read
    if isinstance(image, np.ndarray):
        if image.dtype == np.uint8 and (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 1)):
            image = np.repeat(image.reshape(*image.shape[:2], 1), 3, axis=2)  # grey: as PIL's convert("RGB")
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"segment: expected an H x W x 3 (colour) or H x W / H x W x 1 (grey) uint8 array, got "
                             f"{image.dtype} {image.shape}")
        image = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
    if not isinstance(image, Tensor):
        raise ValueError(f"segment: expected a path, PIL image, array or tensor, got {type(image).__name__}")
    image = image.as_subclass(Tensor)
    if image.dim() not in (3, 4) or image.shape[-3] != 3:
        raise ValueError(f"segment: expected a 3 x H x W or B x 3 x H x W tensor, got shape {tuple(image.shape)}")
    if image.numel() == 0:
        raise ValueError(f"segment: the image is empty (shape {tuple(image.shape)}): nothing to segment")
    if image.dtype == torch.uint8:
        image = image_transform(mean, std)(image)
    elif not image.is_floating_point():
        raise ValueError(f"segment: expected a uint8 or floating-point tensor, got {image.dtype}")
    return image if image.dim() == 4 else image.unsqueeze(0)


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of ``model``'s floating-point parameters, which :func:`segment` gives its inputs (``float32`` for a
    model without any): a ``float16`` / ``float64`` image meets a ``float32`` network as its ``float32`` copy."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def inference_module(model: nn.Module, *, mode: str = "whole", window: Optional[int] = None,
                     stride: Optional[int] = None, scales: Optional[Sequence[float]] = None, flip: bool = False,
                     info: Optional[ModelInfo] = None, window_batch: Optional[int] = None,
                     window_memory: Union[None, int, str] = None) -> nn.Module:
    """``model`` inside the module that computes logits at the input's size as ``mode`` / ``scales`` / ``flip`` say
    (see the module's description); ``model`` itself for ``mode="whole"`` without scales or flip.

    Args:
        model: a segmentation model in eval mode.
        mode: ``"whole"`` or ``"slide"``.
        window, stride: the windows of ``"slide"`` (default: the training crop, and two thirds of the window), or
            of the multi-scale windows (default: the training crop and two thirds of it).
        scales: multi-scale evaluation, relative to the training ``base_size``.
        flip: average with the flipped image.
        info: the sizes and classes (default: ``model.info``, see :func:`~encoding.inference.loading.model_info`;
            needed for the default window and for ``scales``).
        window_batch: windows per forward (default: as many as ``window_memory`` holds, :class:`WindowBudget`).
        window_memory: bytes (or ``"2GiB"``) the windows of one forward may take (default:
            :func:`default_window_memory`: 64 MiB on a CPU, half the free memory of a GPU).

    Raises:
        ValueError: an unknown mode. InferenceOptionError: a window, stride or window batch that is not positive,
            ``scales`` with ``mode="slide"``, a stride larger than the window (see :func:`check_windows`), both
            ``window_batch`` and ``window_memory``, an unreadable memory size, or a size ``info`` does not record:
            ``mode="slide"`` without ``window`` and no ``crop_size``; ``scales`` without ``base_size``, or without
            ``window`` and no ``crop_size`` (the message names the size and the argument to pass).
    """
    check_windows(window, stride)
    window, stride = (None if v is None else int(v) for v in (window, stride))  # numpy's ints as Python's
    batch = _window_batch(model, window_batch, window_memory, flip)
    if mode not in INFERENCE_MODES:
        raise ValueError(f"unknown inference mode {mode!r}; valid: {', '.join(INFERENCE_MODES)}")
    if mode == "whole" and (window is not None or stride is not None) and not scales:
        raise ValueError("window / stride are options of mode='slide' (or of scales=...), not of mode='whole'")
    if mode == "whole" and (window_batch is not None or window_memory is not None) and not scales:
        raise ValueError("window_batch / window_memory are options of mode='slide' (or of scales=...), not of "
                         "mode='whole' (one pass over the whole image)")
    if scales and mode == "slide":  # MultiEvalModule pads its windows: another method than mode="slide"'s
        raise InferenceOptionError("mode='slide' is single-scale (mmsegmentation's windows); scales=... slide "
                                   "PyTorch-Encoding's padded windows over each scale: drop mode='slide' or scales")
    if scales:
        info = info or model_info(model)
        use = f"scales={tuple(scales)!r}"
        window = window or _recorded(info.crop_size, use, "crop_size (the default window)",
                                     "pass window=N (test.py / demo.py: --crop-size N)")
        base_size = _recorded(info.base_size, use, "base_size (the long side at scale 1)", "set it: model.info = "
                              "dataclasses.replace(model.info, base_size=N) (test.py / demo.py: --base-size N)")
        check_windows(window, stride)
        return MultiEvalModule(model, info.out_channels, base_size=base_size, crop_size=window, scales=scales,
                               flip=flip, stride=min(stride, window) if stride else None, mean=info.mean,
                               std=info.std, window_batch=batch)
    if mode == "slide":
        window = window or _recorded((info or model_info(model)).crop_size, "mode='slide' without a window",
                                     "crop_size (the default window)", "pass window=N (test.py: --window N)")
        check_windows(window, stride)
    elif not flip:
        return model
    return SlidingWindow(model, window, stride, flip, window_batch=batch)


def _recorded(size: Optional[int], use: str, name: str, remedy: str) -> int:
    """``size`` (one of ``model.info``'s training sizes) that ``use`` needs.

    Raises:
        InferenceOptionError: ``size`` is ``None`` (not recorded): one line naming ``use``, the size and ``remedy``.
    """
    if size is None:
        raise InferenceOptionError(f"{use}: model.info records no {name}; {remedy}")
    return size


def windows_unused(module: nn.Module) -> Optional[str]:
    """Why ``module`` (an :func:`inference_module`) runs no windows, so that a window batch would change nothing:
    ``None`` where it may run several (a :class:`~encoding.models.SlidingWindow` with a window: an image larger than
    it; a :class:`~encoding.models.MultiEvalModule` with a scale whose long side ``ceil(base_size * scale)``
    exceeds its crop)."""
    if isinstance(module, SlidingWindow) and module.window is not None:
        return None
    if isinstance(module, MultiEvalModule):
        longest = max(math.ceil(module.base_size * scale) for scale in module.scales)
        if longest > module.crop_size:
            return None
        return (f"each image is resized to a long side of at most {longest} px (base_size {module.base_size} x "
                f"scales {', '.join(f'{s:g}' for s in module.scales)}), within one {module.crop_size} px window")
    return "every image runs in one pass"


def _window_batch(model: nn.Module, window_batch: Optional[int], window_memory: Union[None, int, str],
                  flip: bool) -> WindowBatch:
    """``window_batch`` checked, else the :class:`WindowBudget` of ``window_memory``."""
    if window_batch is None:
        return WindowBudget(model, window_memory, flip)
    if window_memory is not None:
        raise InferenceOptionError(f"window_batch={window_batch!r} and window_memory={window_memory!r}: give one "
                                   "(the batch, or the memory it is chosen from)")
    if isinstance(window_batch, bool) or not isinstance(window_batch, (int, np.integer)) or window_batch < 1:
        raise InferenceOptionError(f"window_batch must be a positive number of windows, got {window_batch!r}")
    return int(window_batch)


def run_device(model: nn.Module, device: Optional[Union[str, torch.device]] = None) -> torch.device:
    """Where :func:`segment` runs ``model``: the device of its parameters (the CPU for a model without any).
    ``device``, when given, must name that device (``"cuda"`` names any CUDA device): the caller's model is never
    moved behind its back, as :func:`~encoding.inference.loading.load_model` puts it where ``device=`` says.

    Raises:
        InferenceOptionError: an unknown device, or another than the model's (one line naming both).
    """
    own = next((p.device for p in model.parameters()), torch.device("cpu"))
    if device is None:
        return own
    try:
        wanted = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InferenceOptionError(f"device {str(repr(device))[:60]}: {str(err).splitlines()[0]}") from None
    if wanted.type != own.type or wanted.index not in (None, own.index):
        raise InferenceOptionError(f"device={str(wanted)!r}: the model's parameters are on {own}; segment runs the "
                                   f"model where it is: move it first (model.to({str(wanted)!r})) or drop device=")
    return own


@torch.inference_mode()
def segment(model: nn.Module, image: ImageLike, *, mode: str = "whole", window: Optional[int] = None,
            stride: Optional[int] = None, scales: Optional[Sequence[float]] = None, flip: bool = False,
            device: Optional[Union[str, torch.device]] = None, window_batch: Optional[int] = None,
            window_memory: Union[None, int, str] = None) -> Tensor:
    """The class ids of ``image``, at its size.

    Args:
        model: a segmentation model in eval mode (from :func:`~encoding.inference.loading.load_model`, or any model
            whose output is ``{"out": logits}`` or logits at its input's size).
        image: a path, PIL image, ``H x W x 3`` (or grey ``H x W``) ``uint8`` array or tensor (see
            :func:`to_batch`); any size. A floating-point tensor is converted to the model's parameters' dtype
            (:func:`model_dtype`): a ``float64`` or ``float16`` image gives the labels of its ``float32`` copy.
        mode, window, stride, scales, flip: how (see :func:`inference_module`).
        window_batch, window_memory: how many windows one forward runs, or the memory they may take (see
            :func:`inference_module`).
        device: where to run: the model's parameters' device (the default), which a given device must be (the
            model is not moved: ``model.to(device)`` first; see :func:`run_device`).

    Returns:
        ``H x W`` ``int64`` class ids on the CPU (``B x H x W`` for a batch).

    Memory (on ``device``): the normalised image (``B x 3 x H x W`` float32) and the logits at its size (``B x nclass
    x H x W`` float32, accumulated in place by ``"slide"`` and ``scales``) plus, for ``"slide"``, an ``H x W`` count
    and one forward's windows: at most ``window_memory`` bytes (inputs, activations and logits of ``window_batch``
    windows; at least one window); ``"whole"``: the model's activations on the whole image. The labels are
    ``int64`` ``B x H x W``. A 2000 x 2000 image with 150 classes: 2.4 GB of logits, held once.

    Raises:
        ValueError: an image of the wrong type or shape, or empty (``0 x 0``); a bad mode, window or stride; a
            size the window or scales need that ``model.info`` does not record, a scale that is not a finite number
            above 0, scales whose largest resized image is over the pixel limit, a ``device`` other than the
            model's (:class:`InferenceOptionError`).

    Example:
        >>> model = encoding.load_model("runs/shapes/unet/default/model_best.pth")   # doctest: +SKIP
        >>> labels = encoding.segment(model, "photo.jpg", mode="slide", window=512, stride=341)  # doctest: +SKIP
    """
    info = getattr(model, "info", None)
    norm = (info.mean, info.std) if isinstance(info, ModelInfo) else (IMAGENET_MEAN, IMAGENET_STD)
    batch = to_batch(image, *norm)
    device = run_device(model, device)
    module = inference_module(model, mode=mode, window=window, stride=stride, scales=scales, flip=flip,
                              info=info if isinstance(info, ModelInfo) else None, window_batch=window_batch,
                              window_memory=window_memory)
    threshold = info.threshold if isinstance(info, ModelInfo) else ModelInfo.threshold  # what the exports say too
    labels = labels_of(main_output(module(batch.to(device, model_dtype(model)))), threshold).cpu()
    return labels if isinstance(image, Tensor) and image.dim() == 4 else labels[0]
