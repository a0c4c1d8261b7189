"""Inference helpers for evaluation and demo scripts: read an image, segment it, write coloured masks and overlays.

* :func:`read_image`: any JPEG/PNG (grey-scale, palette or RGBA converted to RGB) as a normalised tensor, with a
  one-line :class:`~encoding.datasets.DatasetError` naming a file that is not an image;
* :class:`PredictionWriter`: coloured PNG masks (dataset palette, class ids as pixel values) named after the inputs;
* :func:`overlay_with_legend`: the image blended with its mask (the background class left unblended), with a legend
  of the classes present (``demo.py``'s outputs: :mod:`encoding.inference.demo`);
* :class:`EvaluationConfig` → :meth:`EvaluationConfig.network` / :func:`build_evaluation`: the network of a checkpoint
  (:func:`~encoding.inference.loading.load_model`), a model-zoo preset or torchvision's weights, and the
  :class:`EvaluationJob` of ``test.py`` (segmenting through :func:`evaluation_module`).
"""
from __future__ import annotations

import io
import os
from contextvars import ContextVar
from dataclasses import dataclass, fields, make_dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor, nn

from torch.utils.data import DataLoader, Dataset

from ..engine import builders
from ..datasets.metadata import resolve_dataset
from ..datasets.base import BaseDataset
from ..datasets.transforms import image_transform
from ..config.evaluation import evaluation_fields, fill_evaluation, given_options, weights_layer
from ..errors import UsageError
from ..models.factory import nclass_of
from ..models.network import NetworkSpec
from ..names import network_name
from ..parallel import DataParallelModel
from ..utils.dist import get_rank, get_world_size, init_distributed_mode
from ..utils.files import atomic_write
from ..utils.metrics import SegmentationMetric
from ..utils.palette import colorize, get_palette, overlay
from ..engine.compiled import compile_mode, compile_model
from ..engine.assemble import AMP_DTYPES, parse_device_ids
from ..engine.data import binary_targets, check_classes, eval_dataset_options
from .loading import NETWORK_OPTIONS, ModelInfo, load_model
from ..engine.loop import predicted_labels
from .outputs import ERRORS_DIR, OutputClaims, prediction_filename, sample_names
from .predict import InferenceOptionError, check_windows, inference_module, windows_unused

__all__ = ["read_image", "PredictionWriter", "prediction_filename", "save_png", "overlay_with_legend",
           "background_ids", "EvaluationConfig", "EvaluationJob", "evaluation_module", "build_evaluation"]


def read_image(path: str) -> Tensor:
    """The image at ``path`` as a normalised ``float32 3 x H x W`` tensor (ImageNet mean/std, as the datasets).

    Read by :func:`encoding.datasets.base.read_rgb`, the reader of the datasets: upright by its EXIF orientation,
    16-bit grey scaled to 8 bits, any mode converted to RGB.

    Raises:
        DatasetError: the file is missing or is not a readable image (the message names it).
    """
    return image_transform()(BaseDataset._read_image(path)).as_subclass(Tensor)


class PredictionWriter:
    """Write predicted class maps as coloured PNGs named after their input files.

    The PNGs are palettised (:func:`~encoding.utils.colorize`): their pixel values are the class ids and their
    palette the dataset's colours, so ``np.array(Image.open(path))`` gives the prediction back. No file is written
    twice in one run (:class:`OutputClaims`): a second prediction, or an error map, for a path is refused.

    Args:
        out_dir: where the PNGs go (created).
        dataset: a dataset name (its palette) or an explicit list of RGB triples.
        error_maps: the run writes error maps, into ``errors_dir``: ``out_dir/errors`` (else ``None``).
        names: every sample's name, when known: two of them whose files would be one are refused before anything
            is written.

    Raises:
        UsageError: two ``names`` whose prediction or error map files would be one (the message names both).

    Example:
        >>> writer = PredictionWriter("preds", "shapes")          # doctest: +SKIP
        >>> writer([labels], ["000001.jpg"])                       # doctest: +SKIP -> preds/000001.png
    """

    def __init__(self, out_dir: str, dataset: Any, error_maps: bool = False,
                 names: Optional[Sequence[str]] = None) -> None:
        self.out_dir, self.dataset = out_dir, dataset
        self.errors_dir = os.path.join(out_dir, ERRORS_DIR) if error_maps else None
        self.claims, planned = OutputClaims(), OutputClaims()
        for name in names or ():
            for folder, kind in ((out_dir, "prediction"), (self.errors_dir, "error map")):
                if folder is not None:
                    planned.claim(folder, name, kind)
        os.makedirs(out_dir, exist_ok=True)
        self.written: List[str] = []

    def __call__(self, labels: Sequence[Tensor], names: Sequence[str]) -> None:
        if len(labels) != len(names):
            raise ValueError(f"{len(labels)} predictions for {len(names)} file names")
        for label, name in zip(labels, names):
            path = self.claims.claim(self.out_dir, name, "prediction")
            save_png(colorize(label, self.dataset), path)
            self.written.append(path)


def save_png(image: Image.Image, path: str) -> None:
    """Write ``image`` as a PNG at ``path`` atomically (no half-written file is ever seen there; its folder made)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write(path, buffer.getvalue())


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: a fixed-size bitmap font
        return ImageFont.load_default()


def background_ids(class_names: Sequence[str]) -> List[int]:
    """The ids of the classes named ``background`` (none in e.g. ADE20K or Cityscapes)."""
    return [i for i, name in enumerate(class_names) if name.lower().strip("_") == "background"]


def overlay_with_legend(image: Any, labels: Any, dataset: str, class_names: Sequence[str],
                        alpha: float = 0.5, blend_background: bool = False) -> Image.Image:
    """The image blended with its coloured mask, above a legend of the classes present (colour swatch + name).

    Args:
        image: PIL image, ``H x W x 3`` uint8 array or ``3 x H x W`` tensor in ``[0, 1]``.
        labels: ``H x W`` class ids.
        dataset: dataset name (its palette), or the palette itself (one ``(r, g, b)`` per class).
        class_names: name of every class id.
        alpha: weight of the mask colours.
        blend_background: blend the ``background`` class too (its colour is black in the VOC colours: the whole
            photo darkens); by default its pixels show the image unblended.

    Returns:
        An RGB image as wide as the input and taller by the legend (one row of 16 px per class present).
    """
    blended = overlay(image, labels, dataset, alpha, unblended=() if blend_background else background_ids(class_names))
    ids = np.asarray(labels).reshape(-1)
    present = [int(c) for c in np.unique(ids) if 0 <= c < len(class_names)]
    palette, row = get_palette(dataset) if isinstance(dataset, str) else dataset, 16
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


def weights_options(path: str, names: Sequence[str]) -> Dict[str, Any]:
    """What ``--resume``'s checkpoint recorded for ``test.py`` / ``demo.py`` (``read_saved`` of
    :func:`~encoding.config.resolve`): the options ``names`` and a folder dataset's root; a user's dataset class is
    imported from the path the checkpoint recorded (registered under its own dataset name; inside
    :func:`~encoding.config.evaluation.weights_layer`'s trust check)."""
    from ..engine.state import saved_options

    saved = saved_options(path, (*names, "data_root", "dataset_class"))
    if saved.get("dataset"):
        resolve_dataset(saved["dataset"], saved.get("dataset_class"))
    return {k: v for k, v in saved.items() if k != "dataset_class"}


#: Set while :meth:`EvaluationConfig.from_options` builds a config from resolved options.
_FROM_OPTIONS: ContextVar[bool] = ContextVar("evaluation_from_options", default=False)


class _Evaluation:
    """The methods of :class:`EvaluationConfig` (its fields are made from the option fields)."""

    def __post_init__(self) -> None:
        resolved = _FROM_OPTIONS.get()
        fill_evaluation(vars(self), resolved=resolved, inherited=() if resolved else self._weights_network())

    def _weights_network(self) -> List[str]:
        """A hand-built config's network options (and a folder run's ``data_root``) left at their defaults: what
        the weights record, as ``test.py`` takes them (:func:`~encoding.config.evaluation.weights_layer`); returns
        the names set. Nothing where the weights are not one readable source (:meth:`network` says what is wrong)."""
        if bool(self.resume) + bool(self.model_zoo) + bool(self.torchvision_weights) != 1 or \
                (self.resume and not os.path.isfile(self.resume)):
            return []
        defaults = {name: field.default for name, _, field in evaluation_fields()}
        _, recorded = weights_layer("test", given_options(vars(self)), weights_options)
        taken = [k for k, v in recorded.items()  # a value equal to the recorded one: taken (a copy of a config)
                 if k in defaults and v is not None and getattr(self, k) in (defaults[k], v)]
        for name in taken:
            setattr(self, name, recorded[name])
        return taken

    @classmethod
    def from_options(cls, options: Any) -> "EvaluationConfig":
        """The fields of ``options`` (e.g. ``test.py``'s resolved namespace, its rules applied) that this class has."""
        token = _FROM_OPTIONS.set(True)
        try:
            return cls(**{f.name: getattr(options, f.name) for f in fields(cls) if hasattr(options, f.name)})
        finally:
            _FROM_OPTIONS.reset(token)

    @property
    def weights(self) -> str:
        """``PATH`` / ``model-zoo:NAME`` / ``torchvision``: where the weights come from."""
        return self.resume or (f"model-zoo:{self.model_zoo}" if self.model_zoo else "torchvision")

    def network(self, device: torch.device) -> nn.Module:
        """The network of ``resume`` / ``model_zoo`` (:func:`~encoding.inference.loading.load_model`, with the
        network options of this configuration) or ``torchvision_weights``, on ``device``, in eval mode, with its
        :class:`~encoding.inference.loading.ModelInfo`.

        Raises:
            CheckpointError, ValueError, RuntimeError: unreadable or mismatching weights, unknown names, offline.
        """
        options = {name: getattr(self, name) for name in NETWORK_OPTIONS}
        if not self.torchvision_weights:
            return load_model(self.resume or self.model_zoo, device=device, trust_code=self.trust_code, **options)
        model = NetworkSpec.from_options(options, nclass_of(self.dataset), pretrained="torchvision").build()
        model.info = ModelInfo.of_dataset(**options)
        return model.to(device).eval()


EvaluationConfig = make_dataclass("EvaluationConfig", evaluation_fields(), bases=(_Evaluation,), namespace={
    "__module__": __name__, "__doc__": (
        "The options of ``test.py`` / ``demo.py``, one keyword each (made from their option fields, with their "
        "defaults): the network, exactly one source of weights (``resume``: a checkpoint of ``train.py``; "
        "``model_zoo``: a preset with published weights; ``torchvision_weights``: torchvision's published weights "
        "of the whole network), how to evaluate (``mode``: ``val`` batched centre crops, ``testval`` whole images, "
        "``test`` predict only; ``inference``: ``whole`` or ``slide`` with ``window`` / ``stride``, see "
        ":func:`~encoding.inference.predict.inference_module`).\n\n"
        "Unset values follow ``test.py``'s rules (:func:`encoding.config.evaluation.fill_evaluation`), as on the "
        "command line; the network options left at their defaults come from the weights, as ``test.py`` takes them "
        "(a value given wins).")})


#: The scales of single-scale whole-image evaluation: the image resized so that its long side is the training
#: ``base_size`` (PyTorch-Encoding's ``--eval`` at scale 1, mmsegmentation's test resize), the logits resized back
#: and scored at the image's own size.
TRAINING_SCALE = (1.0,)


def evaluation_module(model: nn.Module, config: EvaluationConfig) -> nn.Module:
    """``model`` inside the inference module of ``config`` (:func:`~encoding.inference.predict.inference_module`):
    ``--mode slide`` windows, or ``--multi-scale`` scales + flip, ``--window-batch`` windows per forward (default:
    from the memory they may take, :class:`~encoding.inference.predict.WindowBudget`); whole images single-scale at
    the training scale (:data:`TRAINING_SCALE`, no flip); ``model`` itself for ``val``'s crops. The module carries
    ``model``'s :class:`~encoding.inference.loading.ModelInfo` (``info``).

    Raises:
        InferenceOptionError: ``window_batch`` where no windows run (``val``'s crops, or whole images whose long side
            at every scale fits in the crop: :func:`~encoding.inference.predict.windows_unused`), or a size the
            windows / scales need that ``model.info`` does not record (``test.py`` / ``demo.py`` exit with status 2).
    """
    whole = config.inference != "slide" and config.mode != "val"
    scales = config.scales if config.multi_scale else TRAINING_SCALE if whole else None
    windowed = config.inference == "slide" or bool(scales)  # the modules that may run windows
    module = inference_module(model, mode=config.inference, window=config.window, stride=config.stride,
                              scales=scales, flip=config.multi_scale,
                              window_batch=config.window_batch if windowed else None)
    unused = windows_unused(module) if config.window_batch is not None else None
    if unused:
        raise InferenceOptionError(f"--window-batch {config.window_batch}: no windows run: {unused}; drop "
                                   "--window-batch")
    info = getattr(model, "info", None)
    if module is not model and info is not None:
        module.info = info  # the wrapper segments as the network does: its classes, colours and sizes
    return module


@dataclass
class EvaluationJob:
    """What ``test.py`` needs; built by :func:`build_evaluation`."""

    config: EvaluationConfig
    model: nn.Module
    loader: DataLoader
    metric: SegmentationMetric
    class_names: List[str]
    devices: List[torch.device]
    input_device: Optional[torch.device]
    out_dir: str
    amp_dtype: Optional[torch.dtype] = None
    writer: Optional[PredictionWriter] = None

    def write_predictions(self, outputs: Any, batch: Any) -> None:
        """``on_outputs`` hook of the evaluation loops: save the batch's predictions (with ``save_pred``)."""
        if self.writer is not None:
            self.writer(predicted_labels(outputs, self.metric.threshold), list(batch[-1]))

    def describe(self) -> str:
        """A one-line summary of the job for the log."""
        c = self.config
        where = (f"rank {get_rank()}/{get_world_size()}" if get_world_size() > 1
                 else f"devices {[str(d) for d in self.devices]}")
        how = (f"multi-scale {list(c.scales)} + flip" if c.multi_scale else
               f"sliding window {c.window} / stride {c.stride}" if c.inference == "slide" else "single scale")
        return (f"{network_name(c.model, c.backbone)} ({c.weights}) on {c.dataset} {c.split!r} "
                f"({len(self.loader.dataset)} "
                f"samples, mode {c.mode}, {how}), {where}")


def _check_prediction_dir(out_dir: str, dataset: Any) -> None:
    """Refuse a ``save_pred`` folder inside the evaluated dataset's folder: the predictions (``<stem>.png``) would
    replace its masks (``SegmentationClass/<stem>.png``) or images."""
    while not hasattr(dataset, "dataset_dir") and isinstance(getattr(dataset, "dataset", None), Dataset):
        dataset = dataset.dataset
    folder = getattr(dataset, "dataset_dir", None)
    if not isinstance(folder, str):
        return
    folder, target = os.path.realpath(folder), os.path.realpath(out_dir)
    if target == folder or target.startswith(folder + os.sep):
        raise UsageError(f"--save-pred {out_dir}: inside the dataset folder {folder}, whose files the predictions "
                         "could replace; give a folder outside it")


def build_evaluation(config: EvaluationConfig, data: Optional[Dataset] = None) -> EvaluationJob:
    """Build the :class:`EvaluationJob` of ``config``.

    ``val`` mode: batches of ``test_batch_size`` through :class:`~encoding.parallel.DataParallelModel` on the
    devices; ``testval`` / ``test``: whole images, one per device (:func:`encoding.engine.evaluate_images`), through
    :class:`~encoding.models.MultiEvalModule` with ``multi_scale``. Under ``torchrun`` each process evaluates its
    shard of the samples on its own device.

    Args:
        data: the dataset to evaluate (built with ``return_name=True``) instead of ``config.dataset``'s split.
    """
    c = config
    check_windows(c.window, c.stride)  # before any work: a stride past the window leaves pixels no window covers
    if c.save_pred and c.mode == "val":  # a mask saved under an image's name has that image's size
        raise UsageError("save_pred writes whole-image predictions: use mode 'testval' or 'test', not 'val' "
                         "(resized centre crops)")
    distributed = init_distributed_mode()
    placement = builders.select_devices(parse_device_ids(c.device_ids), use_cuda=not c.no_cuda,
                                        distributed=distributed)
    device = placement.model_device
    devices = list(placement.device_ids) or [device]
    network = c.network(device)
    if compile_mode(c.compile, devices):
        compile_model(network, compile_mode(c.compile, devices), devices=devices)
    info = network.info
    resolve_dataset(c.dataset, info.options.get("dataset_class"), trust_code=c.trust_code)  # from the checkpoint
    model = evaluation_module(network, c)
    if c.mode == "val":
        batch_size = c.test_batch_size
        if not distributed:
            model = DataParallelModel(model, placement.device_ids)
    else:
        batch_size = len(devices)
    out_dir = c.out_dir or (os.path.dirname(os.path.abspath(c.resume)) if c.resume
                            else os.path.join("runs", c.dataset, c.model, "eval"))
    loader = builders.build_eval_loader(c.dataset, split=c.split, mode=c.mode, batch_size=batch_size,
                                        root=c.data_root, base_size=c.base_size, crop_size=c.crop_size,
                                        workers=c.workers, limit=c.limit, distributed=distributed, data=data,
                                        dataset_options=eval_dataset_options(c.dataset, c.resume, info))
    binary_targets(loader.dataset, info)
    check_classes(loader.dataset, info)
    writer = None
    if c.save_pred:  # each rank writes its shard; every sample's files are checked on each
        _check_prediction_dir(c.save_pred, loader.dataset)
        writer = PredictionWriter(c.save_pred, info.palette, error_maps=c.mode != "test",
                                  names=sample_names(loader.dataset))
    return EvaluationJob(
        config=c, model=model, loader=loader,
        metric=SegmentationMetric(len(info.classes), ignore_index=-1, device=device, binary=info.binary,
                                  threshold=info.threshold),
        class_names=list(info.classes), devices=devices, input_device=placement.input_device,
        out_dir=out_dir, amp_dtype=AMP_DTYPES[c.amp],
        writer=writer)
