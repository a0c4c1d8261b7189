"""What ``test.py`` / ``demo.py`` add to :func:`~.resolve.resolve`: the weights' recorded network options (the
``checkpoint`` source) and the rules of the evaluation modes.
"""
from __future__ import annotations

import os
import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..utils.checkpoint import BEST_NAME, CHECKPOINT_NAME
from .errors import ConfigError
from .fields import option_fields
from .groups import GROUPS, EvalOptions
from .parser import option_specs

__all__ = ["NETWORK_OPTIONS", "MODEL_SPECIFIC", "MULTI_SCALES", "DEFAULT_SCALES", "weights_layer", "resume_problem",
           "evaluation_rules", "evaluation_fields", "given_options", "fill_evaluation", "protocol"]

#: The options that define a trained network (and the sizes its inputs were trained at): the fields marked
#: ``network``. ``test.py`` / ``demo.py`` take them from the weights when not given; a checkpoint records them.
NETWORK_OPTIONS = tuple(f.name for f, o in option_fields(*GROUPS.values()) if o.network)
#: What depends on the network: a recipe's value only for the recipe's own model, else the network's own (``None``).
MODEL_SPECIFIC = ("output_stride", "head_channels")
#: PyTorch-Encoding's multi-scale evaluation scales (``--multi-scale``), per dataset.
MULTI_SCALES = {"citys": (0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25)}
DEFAULT_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75)
#: A ``--torchvision-weights`` network without ``--model`` / ``--backbone``.
TORCHVISION_NETWORK = {"model": "fcn", "backbone": "resnet50"}


def weights_layer(script: str, given: Dict[str, Any],
                  read_saved: Optional[Callable[[str, Sequence[str]], Mapping[str, Any]]]) -> Tuple[str, Dict]:
    """The ``checkpoint`` source: the network options recorded with the weights of ``test.py`` / ``demo.py``
    (``--resume``'s checkpoint, a ``--model-zoo`` preset, torchvision's networks); nothing for ``train.py``.

    Raises:
        ConfigError: not exactly one source of weights, a missing file, an unknown preset.
    """
    if script == "train":
        return "checkpoint", {}
    if given.get("pretrained") == "torchvision":  # the old spelling of --torchvision-weights
        given["torchvision_weights"] = True
    sources = [flag for flag, name in (("--resume", "resume"), ("--model-zoo", "model_zoo"),
                                       ("--torchvision-weights", "torchvision_weights")) if given.get(name)]
    if len(sources) != 1:
        raise ConfigError("pass exactly one of --resume <checkpoint.pth>, --model-zoo NAME or --torchvision-weights"
                          + (f" (got {', '.join(sources)})" if sources else ""))
    if given.get("resume"):
        if problem := resume_problem(given["resume"]):
            raise ConfigError(problem)
        from ..utils.trust import check_trusted, reading
        trust = bool(given.get("trust_code"))
        with reading(given["resume"], trust):  # a dataset class it names is imported only with --trust-code
            saved = dict(read_saved(given["resume"], NETWORK_OPTIONS)) if read_saved else {}
        check_trusted({"model": given.get("model") or saved.get("model")}, given["resume"], trust)
        return f"checkpoint {given['resume']}", {k: v for k, v in saved.items() if v is not None}
    if given.get("model_zoo"):
        return f"checkpoint model-zoo:{given['model_zoo']}", _preset(given["model_zoo"])
    return "checkpoint torchvision", {k: v for k, v in TORCHVISION_NETWORK.items() if k != "backbone"
                                      or "model" not in given}


def resume_problem(path: str) -> Optional[str]:
    """Why ``--resume path`` names no checkpoint file (``None``: it does), with the run's file to pass where the
    path is a run folder, or a file missing beside one (``model_best.pth``, else ``checkpoint.pth``)."""
    if os.path.isfile(path):
        return None
    folder = path if os.path.isdir(path) else os.path.dirname(path) or "."
    near = [os.path.join(folder, name) for name in (BEST_NAME, CHECKPOINT_NAME)
            if os.path.isfile(os.path.join(folder, name))]
    what = "a folder, not a checkpoint" if os.path.isdir(path) else "no such file"
    return f"argument --resume: {what}: {path}" + (f" (the run's file: {near[0]})" if near else "")


def _preset(name: str) -> Dict[str, Any]:
    from ..models import model_list
    from ..models.registry import PRESETS

    if name.lower() not in PRESETS:
        raise ConfigError(f"argument --model-zoo: unknown name {name!r}; e.g. {', '.join(model_list[:4])}, ... "
                          "(encoding.models.model_list)")
    preset = PRESETS[name.lower()]
    return {"dataset": preset["dataset"], "model": preset["name"], "backbone": preset["backbone"],
            "aux": preset["aux"], "se_loss": preset["se_loss"]}


def evaluation_rules(script: str, values: Dict[str, Any], sources: Dict[str, str], rule: Callable) -> None:
    """The rules of ``test.py`` / ``demo.py``: PE's scales of the dataset; ``test.py``'s mode, window and stride.
    ``--mode slide`` is ``inference="slide"`` (a hand-built config may pair it with an explicit mode, kept).

    Raises:
        ConfigError: options of different modes together, an option the mode never reads, a ``--mode test`` that
            would write nothing.
    """
    values["torchvision_weights"] = values["torchvision_weights"] or values.get("pretrained") == "torchvision"
    if _given(sources, "scales") and not values.get("multi_scale"):  # else set and never read
        raise ConfigError("--scales is an option of --multi-scale")
    if values["scales"] is None:
        rule(values, sources, "scales", MULTI_SCALES.get(values["dataset"], DEFAULT_SCALES),
             f"PyTorch-Encoding's for {values['dataset']}")
    if script != "test":
        return
    slide = values["mode"] == "slide" or values.get("inference") == "slide"
    if slide and values["multi_scale"] or (values["window"] or values["stride"]) and not slide:
        raise ConfigError("--mode slide is single-scale, without --multi-scale" if slide else "--window / --stride "
                          "are options of --mode slide")
    if values["mode"] in (None, "slide"):
        mode = "test" if values["split"] == "test" else "testval"  # whole images, as PE's --eval and mmseg score
        rule(values, sources, "mode", mode, "the split")
    values["inference"] = "slide" if slide else "whole"
    if slide and not values["window"]:
        rule(values, sources, "window", values["crop_size"], "--crop-size")
    if slide and not values["stride"] and values["window"]:  # no window: inference says what to give
        rule(values, sources, "stride", max(values["window"] * 2 // 3, 1), "2/3 of --window")
    if values["mode"] == "val" and (values["multi_scale"] or values["save_pred"]):
        raise ConfigError(f"{'--multi-scale' if values['multi_scale'] else '--save-pred'} works on whole images: use "
                          "--mode testval (its default) or --mode test")
    _check_unread(values, sources)
    _check_outputs(values, sources)
    if _given(sources, "test_batch_size") and values["mode"] != "val":
        given = "slide" if values.get("inference") == "slide" else values["mode"]
        raise ConfigError(f"--test-batch-size is the batch of --mode val; --mode {given} runs whole images, one per "
                          "device" + (" (its windows: --window-batch)" if given == "slide" else ""))
    if values["test_batch_size"] is None:
        rule(values, sources, "test_batch_size", 16, "test.py's")


def _check_unread(values: Dict[str, Any], sources: Dict[str, str]) -> None:
    """Refuse a size option given where ``test.py``'s mode never reads it."""
    slide = values["inference"] == "slide"
    if _given(sources, "base_size") and (values["mode"] == "val" or slide) and not values["multi_scale"]:
        why = "--mode slide runs each image at its own size" if slide else "--mode val crops at --crop-size"
        raise ConfigError(f"--base-size is the size whole images are resized to (--mode testval / test, "
                          f"--multi-scale); {why}")
    if _given(sources, "crop_size") and slide and _given(sources, "window"):
        raise ConfigError("--crop-size is --mode slide's window when --window is not given; pass one of them")


def _check_outputs(values: Dict[str, Any], sources: Dict[str, str]) -> None:
    """Refuse a ``test.py --mode test`` that would write nothing: it scores nothing and keeps only ``--save-pred``."""
    if values["mode"] == "test" and not values["save_pred"]:
        raise ConfigError("--mode test predicts without scoring (the test split has no masks) and keeps only what "
                          "--save-pred DIR asks for: pass --save-pred DIR")
    if values["mode"] == "test" and _given(sources, "out_dir"):
        raise ConfigError("--out-dir is where the scores (metrics.json) go; --mode test scores nothing: its "
                          "predictions go to --save-pred DIR")


def _given(sources: Dict[str, str], name: str) -> bool:
    """Whether the user set ``name`` on the command line (``test.py`` / ``demo.py`` read no config file), not a
    default, the checkpoint's value or a rule."""
    return sources.get(name) == "command line"


def evaluation_fields() -> List[Tuple[str, Any, dataclasses.Field]]:
    """The fields of an evaluation's flat config (:class:`~encoding.inference.evaluation.EvaluationConfig`):
    ``test.py``'s option fields with their defaults, and ``inference``; the model-specific options default to ``None``
    (the weights' own, as :func:`~.resolve.resolve` leaves them without a source)."""
    made = [(f.name, f.type, dataclasses.field(default=None if f.name in MODEL_SPECIFIC else f.default,
                                               metadata=f.metadata)) for f, _ in option_specs("test")]
    inference = next(f for f in dataclasses.fields(EvalOptions) if f.name == "inference")
    return made + [(inference.name, inference.type, dataclasses.field(default=inference.default))]


def given_options(values: Mapping[str, Any], inherited: Sequence[str] = ()) -> Dict[str, Any]:
    """The values of a hand-built evaluation config that count as given, as on a command line: set, other than their
    field's default and than what :func:`evaluation_rules` fills in when they are unset, and not ``inherited`` from
    the weights. A config completed once (copied with ``dataclasses.replace``, rebuilt from its fields) is so
    completed again, unchanged."""
    defaults = {name: field.default for name, _, field in evaluation_fields()}
    set_ = [name for name, value in values.items()
            if name in defaults and value is not None and value != defaults[name] and name not in inherited]
    return {name: values[name] for name in set_ if not _rules_fill(values, name, defaults[name])}


def _rules_fill(values: Mapping[str, Any], name: str, default: Any) -> bool:
    """Whether ``values[name]`` is what :func:`evaluation_rules` fills in for ``name`` unset (at ``default``)."""
    trial = {**values, name: default}
    try:
        evaluation_rules("test", trial, {}, _fill)
    except ConfigError:  # refused whatever ``name`` is: the rules' own check refuses these values
        return False
    return trial[name] == values[name]


def _fill(values: Dict[str, Any], sources: Dict[str, str], name: str, value: Any, why: str) -> None:
    """The ``rule`` of a hand-built config (:func:`evaluation_rules`): the value, without a source."""
    values[name] = value


def fill_evaluation(values: Dict[str, Any], resolved: bool = False, inherited: Sequence[str] = ()) -> None:
    """Complete the values of a hand-built evaluation config with ``test.py``'s rules (:func:`evaluation_rules`:
    the mode from the split and the other options, the window and stride of ``inference="slide"``, the batch, the
    scales; a ``mode="test"`` without ``save_pred`` or with ``out_dir`` refused), as the command line would.

    Args:
        values: the config's fields, completed in place.
        resolved: the values come from resolved options (``test.py``'s: their rules applied and their command line
            checked); else the values :func:`given_options` names are taken as given, as on a command line.
        inherited: the names whose values came from the weights (not given: as ``test.py``'s checkpoint source).

    Raises:
        ConfigError: options of different modes together, an option the mode does not read, or a ``mode="test"``
            that would write nothing.
    """
    given = {} if resolved else {name: "command line" for name in given_options(values, inherited)}
    evaluation_rules("test", values, given, _fill)


def protocol(values: Any) -> str:
    """What an evaluation scores, in words (``metrics.json``'s first key, the title of ``test.py``'s table):
    ``"whole images at the training scale"`` (``testval``: the long side resized to the training ``base_size``, the
    logits back to the image's size; ``"whole images, sliding windows 512 / stride 341"`` or ``"whole images,
    scales 0.75, 1, 1.25 + flip"`` for the other inferences), ``"resized centre crops of 480 px"`` (``val``, as
    training validates) or ``"predictions only"``.

    Args:
        values: an evaluation's options (``test.py``'s namespace or an ``EvaluationConfig``), its rules applied.
    """
    if values.mode == "val":
        return f"resized centre crops of {values.crop_size} px" if values.crop_size else "resized centre crops"
    if values.mode == "test":
        return "predictions only"
    if values.inference == "slide":
        return f"whole images, sliding windows {values.window} / stride {values.stride}"
    if values.multi_scale:
        return f"whole images, scales {', '.join(f'{s:g}' for s in values.scales)} + flip"
    return "whole images at the training scale"
