"""A trained network back in Python: :func:`load_model` rebuilds it from what its checkpoint recorded.

``train.py``'s checkpoints (``checkpoint.pth`` / ``model_best.pth``, schema: :mod:`encoding.engine.state`) record the
run's options next to the weights, so a checkpoint path is enough; a preset name of
:data:`encoding.models.model_list` builds the preset and loads its published (or a local file's) weights. The
returned model carries a :class:`ModelInfo` as ``model.info``: the dataset's class names and palette, the input
normalisation and the sizes it was trained at, which :func:`encoding.segment` and :mod:`encoding.export` read.
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from ..config import NETWORK_OPTIONS  # the training options that define the network (the fields marked network)
from ..datasets.metadata import resolve_dataset
from ..datasets.transforms import IMAGENET_MEAN, IMAGENET_STD
from ..errors import UsageError
from ..models import get_model, pretrained_model_list
from ..names import is_model_spec, parse_model_spec
from ..models.network import NetworkSpec
from ..models.registry import PRESETS
from ..utils.checkpoint import CheckpointError, check_state_fits
from ..utils.files import source_files
from ..utils.images import max_pixels
from ..utils.palette import generated_palette, palette_of
from ..utils.trust import UntrustedCode, check_trusted, reading
from ..engine import state
from .sources import record_sources

__all__ = ["ModelInfo", "NETWORK_OPTIONS", "DATA_OPTIONS", "load_model", "model_info", "check_network_options",
           "to_import", "attach_info"]

#: What a checkpoint records about its data (:func:`encoding.datasets.metadata.dataset_metadata`) and the binary
#: options: :class:`ModelInfo` takes them from the checkpoint, so no dataset class is needed to use the model.
DATA_OPTIONS = ("classes", "palette", "ignore_index", "dataset_class", "binary", "binary_class", "threshold",
                "unknown_labels")
_NAMES, _SWITCHES = ("dataset", "model", "backbone"), ("aux", "se_loss")


def check_network_options(options: Dict[str, Any], where: str) -> None:
    """Refuse network options of the wrong type: names that are not strings, switches that are not booleans, sizes
    that are not positive ints (an edited checkpoint, or a call such as ``load_model(path, model=3)``).

    Raises:
        ValueError: one line naming ``where`` (the file or ``load_model``), the option and its value.
    """
    for key, value in options.items():
        if value is None or key not in NETWORK_OPTIONS:
            continue
        if key in _NAMES:
            ok = isinstance(value, str) and (value != "" or key == "backbone")  # "": a spec network's none
        elif key in _SWITCHES:
            ok = isinstance(value, (bool, int)) and value in (0, 1)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        if not ok:
            kind = "a name" if key in _NAMES else "true or false" if key in _SWITCHES else "a positive int"
            raise ValueError(f"{where}: network option {key!r} must be {kind}, got {str(repr(value))[:80]}")


def to_import(options: Dict[str, Any]) -> Dict[str, Any]:
    """``options`` less a ``dataset_class`` that loading would not import: its dataset is registered (the user's
    own process registered it, or a built-in of that name): what ``encoding.utils.trust.check_trusted`` asks
    about."""
    from ..datasets import datasets

    registered = isinstance(options.get("dataset"), str) and options["dataset"].lower() in datasets
    return {k: v for k, v in options.items() if not (k == "dataset_class" and registered)}


@dataclass(frozen=True)
class ModelInfo:
    """What a trained network needs beside its weights to be used: the dataset's classes and colours, the input
    normalisation and the sizes of its training recipe.

    Attributes:
        dataset: the dataset name (:data:`encoding.datasets.datasets`, or a user's dataset).
        classes: the name of every class id.
        palette: one ``(r, g, b)`` per class id.
        ignore_index: the raw mask value of ignored pixels in the training data (``None``: not recorded).
        binary: one foreground channel: label 1 where ``sigmoid(logit) > threshold``.
        mean, std: the per-channel normalisation of the inputs (images in ``[0, 1]``).
        base_size, crop_size: the long side images were scaled around, and the training crop.
        options: the network's options (model, backbone, aux, ...), as :func:`load_model` built it.
    """

    dataset: str
    classes: Tuple[str, ...]
    palette: Tuple[Tuple[int, int, int], ...]
    mean: Tuple[float, ...] = tuple(IMAGENET_MEAN)
    std: Tuple[float, ...] = tuple(IMAGENET_STD)
    base_size: Optional[int] = None
    crop_size: Optional[int] = None
    options: Dict[str, Any] = field(default_factory=dict)
    ignore_index: Optional[int] = None
    binary: bool = False
    threshold: float = 0.5

    def __post_init__(self) -> None:
        # sizes a shared folder or checkpoint gives: an image is scaled to them, so bounded as the images we read
        for name in ("base_size", "crop_size"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 0 < value * value <= max_pixels()):
                raise ValueError(f"{name} {str(repr(value))[:20]} is not a whole number of pixels with its square "
                                 f"under the pixel limit ({max_pixels():,}; --max-pixels)")
        _check_label_fields(self)

    @classmethod
    def of_dataset(cls, dataset: str, **options: Any) -> "ModelInfo":
        """The info of a network trained on ``dataset``: the ``classes`` / ``palette`` / ``ignore_index`` a
        checkpoint recorded (:data:`DATA_OPTIONS`), else the registered class's (a generated palette for
        ``PALETTE = None``); its base and crop sizes unless given in ``options``.

        Raises:
            ValueError: an unknown dataset without recorded classes (the message lists the valid ones).
        """
        data = None
        if not options.get("classes"):
            data = resolve_dataset(dataset, options.get("dataset_class"))
        classes = _tuple(options.get("classes") or data.CLASSES, "classes")
        palette = options.get("palette") or (palette_of(data) if data is not None else generated_palette(len(classes)))
        binary = bool(options.get("binary") or options.get("binary_class"))
        return cls(dataset, classes, _colours(palette),
                   base_size=options.get("base_size") or getattr(data, "BASE_SIZE", None),
                   crop_size=options.get("crop_size") or getattr(data, "CROP_SIZE", None),
                   options={k: v for k, v in options.items() if k in NETWORK_OPTIONS + DATA_OPTIONS and k not in (
                       "dataset", "classes", "palette")},
                   ignore_index=options.get("ignore_index"), binary=binary,
                   threshold=0.5 if options.get("threshold") is None else options["threshold"])

    @property
    def out_channels(self) -> int:
        """The network's output channels: 1 for a binary network, else the number of classes."""
        return 1 if self.binary else len(self.classes)

    @property
    def num_classes(self) -> int:
        """The number of classes."""
        return len(self.classes)

    def to_json(self) -> Dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        data = asdict(self)
        data.update(classes=list(self.classes), palette=[list(c) for c in self.palette], mean=list(self.mean),
                    std=list(self.std))
        return data


def _is_real(value: Any) -> bool:
    """A finite int or float (not a bool, not a string)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _tuple(value: Any, name: str) -> Tuple[Any, ...]:
    """``value`` (a list or tuple) as a tuple; anything else refused naming ``name``."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} {str(repr(value))[:60]} must be a list")
    return tuple(value)


def _colours(palette: Any) -> Tuple[Tuple[Any, ...], ...]:
    """``palette`` as a tuple of colour tuples, whole numbers (numpy's too) as Python ints; other values are kept for
    :func:`_check_label_fields` to refuse (``int(2.7)`` would have made a colour of a wrong value)."""
    return tuple(tuple(int(v) if isinstance(v, numbers.Integral) else v for v in _tuple(c, "palette"))
                 for c in _tuple(palette, "palette"))


def _is_colour(colour: Any) -> bool:
    """An ``(r, g, b)`` of ints in ``[0, 255]``."""
    return (isinstance(colour, tuple) and len(colour) == 3
            and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and 0 <= v <= 255 for v in colour))


def _check_label_fields(info: ModelInfo) -> None:
    """Refuse the fields that make labels and normalise inputs when they are of the wrong type or out of range:
    ``classes`` that are not names, a ``palette`` that is not one ``(r, g, b)`` in ``[0, 255]`` per class, a
    ``binary`` that is not a bool (``"false"`` is true), a ``threshold`` that is no probability in (0, 1), an
    ``ignore_index`` that is not an int, a non-finite mean / std or a std that is not positive (a division by 0).

    Raises:
        ValueError: one line naming the field and its value.
    """
    index = info.ignore_index
    checks = (("classes", isinstance(info.classes, tuple) and len(info.classes) > 0
               and all(isinstance(c, str) for c in info.classes), "a list of class names"),
              ("palette", isinstance(info.palette, tuple) and len(info.palette) == len(info.classes)
               and all(_is_colour(c) for c in info.palette), "one [r, g, b] of ints in [0, 255] per class"),
              ("binary", isinstance(info.binary, bool), "true or false"),
              ("threshold", _is_real(info.threshold) and 0 < info.threshold < 1,
               "a number in (0, 1) (the foreground is sigmoid > threshold)"),
              ("ignore_index", index is None or (isinstance(index, int) and not isinstance(index, bool)),
               "an int or null"),
              ("mean", all(_is_real(v) for v in info.mean), "finite numbers"),
              ("std", all(_is_real(v) and v > 0 for v in info.std), "finite numbers above 0"))
    for name, ok, kind in checks:
        if not ok:
            raise ValueError(f"{name} {str(repr(getattr(info, name)))[:60]} must be {kind}")


def network_files(model: Any) -> List[str]:
    """The files of the folder a ``transformers:PATH`` network is built from (its config.json, its weights): inputs
    that a command writing files must not overwrite (``[]`` for any other network)."""
    if not is_model_spec(model):
        return []
    spec = parse_model_spec(model)
    return source_files(spec.target) if spec.kind == "transformers" and os.path.isdir(spec.target) else []


def model_info(model: nn.Module) -> ModelInfo:
    """The :class:`ModelInfo` that :func:`load_model` attached to ``model``.

    Raises:
        ValueError: ``model`` has none (build it with :func:`load_model`, or set ``model.info``).
    """
    info = getattr(model, "info", None)
    if not isinstance(info, ModelInfo):
        raise UsageError(f"{type(model).__name__} carries no ModelInfo: load it with encoding.load_model, or set "
                         "model.info = encoding.inference.loading.ModelInfo.of_dataset(NAME)")
    return info


def attach_info(model: nn.Module, info: ModelInfo, device: Optional[Union[str, torch.device]],
                sources: List[str]) -> nn.Module:
    """``model`` with ``info`` as ``model.info`` and ``sources`` recorded as the files it was read from
    (:func:`~encoding.inference.sources.record_sources`), on ``device``, in eval mode."""
    model.info = info
    record_sources(model, sources)
    return (model if device is None else model.to(device)).eval()


def load_model(source: Union[str, os.PathLike], *, device: Optional[Union[str, torch.device]] = None,
               weights: Optional[Union[str, os.PathLike]] = None, trust_code: bool = False,
               **options: Any) -> nn.Module:
    """The network of a ``train.py`` checkpoint, or a model-zoo preset, with its weights, in eval mode.

    Args:
        source: a checkpoint file (its recorded options rebuild the network; its weights are read with
            ``weights_only=True``), a :func:`~encoding.inference.hub.save_pretrained` folder or a Hugging Face Hub id
            ``user/repo`` (safetensors, nothing unpickled; :func:`~encoding.inference.hub.load_pretrained`), or a
            preset name of :data:`encoding.models.model_list` (e.g.
            ``"fcn_resnet50_voc"``: the published weights, or ``weights``).
        device: where to put the model (default: the CPU).
        weights: a preset's weights from a local file instead of the published ones.
        trust_code: import and run the code that the network's options name (a ``module:factory`` model spec, a
            dataset class path: the author's code, see ``encoding.utils.trust``); without it such a source is
            refused in one line naming the module. Registry architectures and ``torchvision:`` /
            ``transformers:`` networks need no opt-in.
        **options: network options (:data:`NETWORK_OPTIONS`) given explicitly: they replace the recorded ones
            (needed for a file that records none, e.g. a plain state dict).

    Returns:
        The model, with a :class:`ModelInfo` as ``model.info``; the files read are recorded on it
        (:func:`~encoding.inference.sources.input_files`): :func:`encoding.export.export_model` and
        :func:`~encoding.inference.hub.save_pretrained` refuse to write over them.

    Raises:
        FileNotFoundError: ``source`` is neither a file nor a preset name.
        CheckpointError: an unreadable or unsafe file, or weights that do not match the network.
        UsageError: an unknown option, or a file that records no network options (the message names the file).
        UntrustedCode: the network names code and ``trust_code`` is not set (one line naming the module).
        WeightsUnavailable: published weights that are not cached while offline (one line, naming where to put them).
    """
    unknown = sorted(set(options) - set(NETWORK_OPTIONS))
    if unknown:
        raise UsageError(f"load_model: unknown option(s) {', '.join(unknown)}; valid: {', '.join(NETWORK_OPTIONS)}")
    given = {k: v for k, v in options.items() if v is not None}
    check_network_options(given, "load_model")
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"load_model: source must be a checkpoint path or a preset name, got "
                         f"{type(source).__name__}")
    path = os.fspath(source)
    if not os.path.isfile(path) and path.lower() in PRESETS:
        return _load_preset(path.lower(), device, weights, given)
    if weights is not None:
        raise UsageError(f"load_model({path!r}, weights={os.fspath(weights)!r}): weights= replaces a preset's "
                         "published weights; a checkpoint file or a shared model holds its own")
    shared = _load_shared(path, device, given, trust_code)
    if shared is not None:
        return shared
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such checkpoint file or preset name: {path!r} (presets: "
                                "encoding.models.model_list)")
    checkpoint = state.read(path, allow_foreign=True)
    args = checkpoint.data.get("args")
    recorded = {k: v for k, v in (args if isinstance(args, dict) else {}).items()
                if k in NETWORK_OPTIONS + DATA_OPTIONS}
    _check_given(path, recorded, given)
    network = {**recorded, **given}
    needed = ("dataset", "model") if is_model_spec(network.get("model")) else ("dataset", "model", "backbone")
    missing = [k for k in needed if not network.get(k)]  # a spec network has no backbone of ours
    if missing:
        raise UsageError(f"{path!r} records no {', '.join(missing)}: pass them, e.g. load_model(path, "
                         "dataset='pascal_voc', model='fcn', backbone='resnet50')")
    check_network_options(network, repr(path))
    check_trusted(to_import(network), path, trust_code)
    with reading(path, trust_code):
        try:
            info = ModelInfo.of_dataset(**network)
        except UntrustedCode:
            raise
        except (ValueError, TypeError) as err:  # a recorded field of the wrong type: named with the file
            raise UsageError(f"{path!r}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
        model = _fitting_network(network, info.out_channels, checkpoint.data["model"], path)
    checkpoint.restore_weights(model)
    return attach_info(model, info, device, [path, *network_files(network.get("model"))])


def _check_given(path: str, recorded: Dict[str, Any], given: Dict[str, Any]) -> None:
    """Refuse an option the checkpoint's network cannot take: a ``backbone`` for a model spec (it has none of the
    toolkit's), another ``dataset`` whose classes are not the ones the checkpoint records (the network's outputs keep
    the recorded names: the dataset would only rename the checkpoint).

    Raises:
        UsageError: one line naming the option.
    """
    model = given.get("model") or recorded.get("model")
    if is_model_spec(model) and given.get("backbone") not in (None, recorded.get("backbone")):
        raise UsageError(f"load_model({path!r}, backbone={given['backbone']!r}): the model spec {model} has no "
                         "backbone of the toolkit's (drop backbone)")
    dataset, classes = given.get("dataset"), recorded.get("classes")
    if not dataset or not classes or dataset == recorded.get("dataset"):
        return
    theirs = tuple(getattr(resolve_dataset(dataset, trust_code=False), "CLASSES", ()) or ())
    if theirs and theirs != tuple(classes):
        raise UsageError(f"load_model({path!r}, dataset={dataset!r}): the network was trained on "
                         f"{recorded.get('dataset')!r} and outputs its {len(classes)} classes, not {dataset}'s "
                         f"{len(theirs)} (drop dataset: the checkpoint's classes and colours are used)")


def _fitting_network(network: Dict[str, Any], nclass: int, weights: Any, path: str) -> nn.Module:
    """The network ``network`` names, built only once its ``meta`` twin (no memory) has the keys and shapes of the
    stored ``weights``: an edited option (``head_channels=10**7``) is refused before anything is allocated.

    Raises:
        ValueError: options the architectures refuse. CheckpointError: weights of another shape.
    """
    try:
        with torch.device("meta"):
            twin = NetworkSpec.from_options(network, nclass, recompute="none").build()
    except UntrustedCode:  # the network names code (a transformers folder's auto_map): the refusal as it is
        raise
    except (ValueError, KeyError, TypeError, NotImplementedError) as err:
        raise ValueError(f"{path!r} records network options that cannot be built: "
                         f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    if not isinstance(weights, dict) or not all(isinstance(v, torch.Tensor) for v in weights.values()):
        raise CheckpointError(f"{path!r}: its 'model' entry is not a state dict")
    check_state_fits(twin, weights, source=repr(path))
    return NetworkSpec.from_options(network, nclass, recompute="none").build()


#: Readers of shared models (``(accepts(source), load(source, device=..., trust_code=...))``) that
#: :func:`load_model` asks before reading a checkpoint file: :mod:`encoding.inference.hub` registers its folders and
#: Hub ids.
SOURCE_READERS: List[Tuple[Callable[[str], bool], Callable[..., nn.Module]]] = []


def _load_shared(path: str, device: Optional[Union[str, torch.device]], options: Dict[str, Any],
                 trust_code: bool) -> Optional[nn.Module]:
    """The model of the first :data:`SOURCE_READERS` entry that accepts ``path``; ``None`` when none does."""
    for accepts, load in SOURCE_READERS:
        if accepts(path):
            if options:
                raise ValueError(f"load_model({path!r}): a shared model records its network; options "
                                 f"{', '.join(sorted(options))} apply to checkpoint files")
            return load(path, device=device, trust_code=trust_code)
    return None


def _load_preset(name: str, device: Optional[Union[str, torch.device]], weights: Optional[Union[str, os.PathLike]],
                 options: Dict[str, Any]) -> nn.Module:
    """A preset of :data:`~encoding.models.model_list` with its published weights, or those of ``weights``."""
    if weights is None and name not in pretrained_model_list():
        raise UsageError(f"no published weights for the preset {name!r}: pass weights='path/to/model.pth' "
                         f"(presets with published weights: {', '.join(pretrained_model_list())})")
    preset = PRESETS[name]
    named = {"dataset": preset["dataset"], "model": preset["name"], "backbone": preset["backbone"]}
    other = {k: v for k, v in options.items() if k in named and v != named[k]}
    if other:
        raise UsageError(f"load_model({name!r}): {', '.join(f'{k}={v!r}' for k, v in other.items())}: the preset is "
                         f"{', '.join(f'{k}={v!r}' for k, v in named.items())} (pass a checkpoint for another network)")
    built = {"aux": preset["aux"], "se_loss": preset["se_loss"],
             **{k: v for k, v in options.items() if k in ("aux", "se_loss", "output_stride", "head_channels")}}
    model = get_model(name, pretrained=weights if weights is not None else True, **built)  # as its info says
    return attach_info(model, ModelInfo.of_dataset(**{**options, **named, **built}), device,
                       source_files(os.fspath(weights)) if weights is not None else [])
