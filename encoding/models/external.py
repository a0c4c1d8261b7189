"""Any network by name: torchvision's builders, a Hugging Face ``save_pretrained`` folder, or your own factory.

A *model spec* is a string with a colon, accepted wherever a model name is (``train.py --model``,
:func:`~encoding.models.get_segmentation_model`, :func:`encoding.load_model`, ``python -m encoding.memory``,
``python -m encoding.export``):

* ``torchvision:NAME`` — ``torchvision.models.get_model(NAME, weights=None, num_classes=N)`` (``aux_loss`` and
  ``weights_backbone=None`` where the builder takes them: nothing is downloaded unless ``pretrained_backbone``);
* ``transformers:PATH`` — ``AutoModelForSemanticSegmentation.from_pretrained(PATH)`` of a ``save_pretrained``
  folder (its classifier resized to N classes when they differ);
* ``package.module:factory`` — ``factory(num_classes=N, **kwargs)`` returning an ``nn.Module``.

Whatever the network returns (a tensor, a dict such as torchvision's ``{"out", "aux"}``, a transformers
``ModelOutput`` with ``logits``, a tuple) goes through ONE adapter, :func:`segmentation_output`, to the toolkit's
``{"out": B x N x H x W[, "aux": ...]}`` at the input resolution; :func:`check_logits` refuses, in one line naming
the spec and the shape, what is no map of the N classes. The spec is the run's ``model`` option (a relative
``transformers:PATH`` made absolute: :func:`absolute_spec`), so the checkpoint records it and
:func:`encoding.load_model` rebuilds the network from it.

Every network option is applied to a spec network or refused in one line (:func:`build_external_model`); a spec
network has no backbone of the toolkit's (:func:`network_name`). A factory's module is imported from the working
directory first (as ``python -m`` does), and only through the trust gate (:mod:`encoding.utils.trust`): a spec read
from someone's checkpoint or model folder is imported only with ``trust_code=True``.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UsageError
from ..names import (ModelSpec, absolute_spec, is_model_spec, names_code, network_flags, network_name,  # noqa: F401
                     parse_model_spec)
from ..utils.trust import OPT_IN, UntrustedCode, allow_import, untrusted_source
from .spec_layers import recompute_spec_network, sync_batchnorm

__all__ = ["ModelSpec", "is_model_spec", "parse_model_spec", "absolute_spec", "network_name", "network_flags",
           "names_code", "UntrustedCode", "SpecOutputError", "segmentation_output", "check_logits", "ExternalModel",
           "NOT_FOR_SPECS", "build_external_model", "sync_batchnorm"]


class SpecOutputError(UsageError, TypeError):
    """A spec network returned what is no per-pixel map of its classes (one line naming the spec and the shape)."""


def _resize(value: Any, size: torch.Size) -> Any:
    if isinstance(value, Tensor) and value.dim() == 4 and value.shape[-2:] != size:
        return F.interpolate(value, size=size, mode="bilinear", align_corners=False)
    return value


def segmentation_output(output: Any, size: torch.Size) -> Dict[str, Tensor]:
    """The toolkit's ``{"out"[, "aux"]}`` from any network's output, maps resized to ``size`` (bilinear).

    Args:
        output: a tensor; a mapping with ``out`` (torchvision) or ``logits`` (transformers' ``ModelOutput``) and
            optionally ``aux``; or a tuple / list whose first entry is the logits and second, if any, the auxiliary
            logits.
        size: the input's ``(H, W)``.

    Raises:
        SpecOutputError: an output none of these describes (a ``TypeError`` too; the message names what came back).
    """
    if isinstance(output, Tensor):
        main, aux = output, None
    elif isinstance(output, Mapping):
        main = output.get("out", output.get("logits"))
        aux = output.get("aux")
    elif isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        main = output[0]
        aux = output[1] if len(output) > 1 and isinstance(output[1], Tensor) else None
    else:
        main = aux = None
    if not isinstance(main, Tensor):
        keys = f" with keys {list(output)}" if isinstance(output, Mapping) else ""
        raise SpecOutputError(f"cannot read segmentation logits from a {type(output).__name__}{keys}: return a "
                              "tensor, a dict with 'out' or 'logits', or a tuple (logits, aux)")
    result = {"out": _resize(main, size)}
    if aux is not None:
        result["aux"] = _resize(aux, size)
    return result


#: The coarsest map :class:`ExternalModel` resizes to the input: stride 32 (torchvision's and SegFormer's logits
#: come at stride 8 and 4); a coarser map, or one of another shape, is no per-pixel map of the classes.
MAX_OUTPUT_STRIDE = 32


def check_logits(spec: str, logits: Tensor, image: Tensor, num_classes: Optional[int]) -> None:
    """Refuse logits that cannot be a per-pixel map of ``num_classes`` classes for ``image``: not ``B x N x h x w``
    with the image's batch, ``N = num_classes`` and ``h, w`` at most :data:`MAX_OUTPUT_STRIDE` times coarser.

    Raises:
        SpecOutputError: one line naming the spec, the shape it returned and the expected one.
    """
    batch, _, height, width = image.shape
    shape = tuple(logits.shape)
    if not all(isinstance(d, int) for d in (*shape, height, width)):  # traced with free sizes (export): unchecked
        return
    ok = (len(shape) == 4 and shape[0] == batch and (num_classes is None or shape[1] == num_classes)
          and shape[2] >= max(height // MAX_OUTPUT_STRIDE, 1) and shape[3] >= max(width // MAX_OUTPUT_STRIDE, 1))
    if not ok:
        classes = "N" if num_classes is None else str(num_classes)
        raise SpecOutputError(
            f"model spec {spec}: returned logits of shape {list(shape)} for an input of shape {list(image.shape)}; "
            f"a segmentation network returns {batch} x {classes} x H' x W' (a map of the classes, at most "
            f"{MAX_OUTPUT_STRIDE} times coarser than the input)")


class ExternalModel(nn.Module):
    """A network built from a spec, its output adapted by :func:`segmentation_output` and checked by
    :func:`check_logits`.

    Attributes:
        net: the wrapped network (state-dict keys ``net.*``).
        spec: the spec it was built from.
        num_classes: the output channels it must return (``None``: unchecked).
    """

    def __init__(self, net: nn.Module, spec: str, num_classes: Optional[int] = None):
        super().__init__()
        self.net = net
        self.spec = spec
        self.num_classes = num_classes

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        raw = self.net(x)
        try:
            output = segmentation_output(raw, x.shape[-2:])
        except SpecOutputError as err:
            raise SpecOutputError(f"model spec {self.spec}: {err}") from None
        check_logits(self.spec, _main_logits(raw), x, self.num_classes)
        return output

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}"


def _main_logits(output: Any) -> Tensor:
    """The main logits of an output :func:`segmentation_output` reads, before resizing."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping):
        return output.get("out", output.get("logits"))
    return output[0]


def _refuse_unknown(spec: str, unknown: Any, takes: str) -> None:
    if unknown:
        names = ", ".join(f"{k} (--head-channels)" if k == "channels" else k for k in sorted(unknown))
        raise UsageError(f"model spec {spec}: takes no option {names}; {takes}")


def _torchvision_builder(name: str) -> Any:
    from torchvision import models
    try:
        return models.get_model_builder(name)
    except ValueError:
        raise UsageError(f"model spec torchvision:{name}: torchvision has no model {name!r}") from None


def _torchvision(name: str, num_classes: int, aux: bool, pretrained_backbone: Any, **kwargs: Any) -> nn.Module:
    builder = _torchvision_builder(name)
    params = inspect.signature(builder).parameters
    own = [p for p, v in params.items() if v.kind == v.KEYWORD_ONLY and p not in (
        "weights", "progress", "num_classes", "aux_loss", "weights_backbone")]
    _refuse_unknown(f"torchvision:{name}", set(kwargs) - set(own),
                    f"its builder's options: {', '.join(own) or 'none'}")
    options: Dict[str, Any] = {"weights": None, "num_classes": num_classes}
    if "weights_backbone" in params:
        options["weights_backbone"] = "DEFAULT" if pretrained_backbone is True else None
    if "aux_loss" in params:
        options["aux_loss"] = aux
    elif aux:
        raise UsageError(f"model spec torchvision:{name}: this builder has no auxiliary head (drop --aux)")
    return builder(**{**options, **kwargs})


def _auto_maps(config: Any) -> List[Any]:
    """The ``auto_map`` entries (class -> the author's code) anywhere in a transformers config (a backbone's
    config included)."""
    if isinstance(config, dict):
        own = [config["auto_map"]] if "auto_map" in config else []
        return own + [m for value in config.values() for m in _auto_maps(value)]
    if isinstance(config, list):
        return [m for value in config for m in _auto_maps(value)]
    return []


def _transformers(path: str, num_classes: int, stored_config: Optional[Dict[str, Any]] = None,
                  **kwargs: Any) -> nn.Module:
    from transformers import AutoConfig, AutoModelForSemanticSegmentation
    source = untrusted_source()
    # data's folder: no pickle, and no code of the folder's (its config's auto_map) on any answer to a prompt
    remote = {} if source is None else {"trust_remote_code": False}
    if stored_config is not None:  # a model folder's record of the network: built from it, weights read apart
        _refuse_unknown(f"transformers:{path}", set(kwargs), "a stored config.json only")
        mapped = _auto_maps(stored_config)
        if source is not None and mapped:
            raise UntrustedCode(f"{source} names code to run: its transformers config maps a network to code "
                                f"(auto_map {mapped[0]!r}); loading a model runs no code of its author's unless you "
                                f"trust it: pass {OPT_IN}")
        return AutoModelForSemanticSegmentation.from_config(AutoConfig.for_model(**stored_config), **remote)
    if not os.path.isdir(path):
        raise UsageError(f"model spec transformers:{path}: no such folder (a save_pretrained folder of a "
                         "semantic-segmentation model)")
    safe = {} if source is None else {"use_safetensors": True, **remote}
    try:
        config, unused = AutoConfig.from_pretrained(path, num_labels=num_classes, return_unused_kwargs=True,
                                                    **kwargs, **remote)
    except ValueError as err:
        if source is not None and "trust_remote_code" in str(err):
            raise UntrustedCode(f"{source} names code to run: the folder {path} asks transformers to import its own "
                                f"code (auto_map); loading a model runs no code of its author's unless you trust it: "
                                f"pass {OPT_IN}") from None
        raise
    _refuse_unknown(f"transformers:{path}", unused, "options of its config.json only")
    if torch.empty(0).device.type == "meta":  # a shape check: no weights read
        return AutoModelForSemanticSegmentation.from_config(config)
    return AutoModelForSemanticSegmentation.from_pretrained(path, config=config, ignore_mismatched_sizes=True,
                                                            **safe)


@contextlib.contextmanager
def _working_directory_importable() -> Iterator[str]:
    """The working directory on ``sys.path`` (first), as ``python -m`` has it, for the duration; yields it."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield cwd
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _import_factory(spec: str) -> Any:
    """The factory of ``package.module:factory`` (imported from the working directory too; the import allowed)."""
    module_name, _, attr = spec.partition(":")
    allow_import(module_name, f"the model spec {spec!r}")
    with _working_directory_importable() as cwd:
        try:
            return getattr(importlib.import_module(module_name), attr)
        except ImportError as err:
            raise UsageError(f"model spec {spec}: cannot import {module_name!r} ({err}); looked in the working "
                             f"directory {cwd} and on sys.path (PYTHONPATH)") from None
        except AttributeError:
            raise UsageError(f"model spec {spec}: cannot import {attr!r}: module {module_name!r} has none") from None


def _factory(spec: str, num_classes: int, pretrained_backbone: Any, **kwargs: Any) -> nn.Module:
    factory = _import_factory(spec)
    params = _parameters(factory)
    if pretrained_backbone:
        kwargs["pretrained_backbone"] = pretrained_backbone
    if params is not None:
        _refuse_unknown(spec, set(kwargs) - params, f"the factory takes {', '.join(sorted(params)) or 'none'}")
    with _working_directory_importable():
        net = factory(num_classes=num_classes, **kwargs)
    if not isinstance(net, nn.Module):
        raise UsageError(f"model spec {spec}: the factory returned a {type(net).__name__}, not an nn.Module")
    return net


def _parameters(function: Any) -> Optional[set]:
    """The keyword names ``function`` takes; ``None`` when it takes any (``**kwargs``) or has no signature."""
    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return None
    return {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"num_classes"}


#: The network options a spec network cannot take, each with why (refused in one line when set).
NOT_FOR_SPECS = {
    "se_loss": "--se-loss: the SE branch is EncNet's head; a spec network has none (drop it)",
    "output_stride": "--output-stride dilates the toolkit's own backbones, not a spec network (drop it)",
    "jpu": "jpu (FastFCN's neck) goes on the toolkit's own backbones, not on a spec network (drop it)",
    "pretrained": "pretrained= loads published weights of the toolkit's architectures, not of a spec network (load "
                  "a spec network's weights with encoding.load_model, or through its own builder)",
}


def check_pretrained_backbone(spec: str, value: Any) -> None:
    """Refuse ``--pretrained-backbone value`` where the network ``spec`` names cannot take it, without building it
    (nothing downloaded or loaded): a ``transformers:`` folder (its weights are its own), a ``torchvision:`` builder
    without a backbone or given a file (only torchvision's own backbone weights apply), a factory without a
    ``pretrained_backbone`` keyword.

    Raises:
        ValueError: one line naming the spec and the option.
    """
    if value in (None, False):
        return
    parsed = parse_model_spec(spec)
    if parsed.kind == "transformers":
        raise UsageError(f"model spec {spec}: --pretrained-backbone: its weights are the folder's own")
    if parsed.kind == "torchvision":
        builder = _torchvision_builder(parsed.target)
        if value is not True or "weights_backbone" not in inspect.signature(builder).parameters:
            raise UsageError(f"model spec {spec}: --pretrained-backbone {value}: only torchvision's own backbone "
                             "weights (--pretrained-backbone alone) apply, where the builder has a backbone")
        return
    params = _parameters(_import_factory(parsed.target))
    if params is not None and "pretrained_backbone" not in params:
        _refuse_unknown(spec, {"pretrained_backbone"}, f"the factory takes {', '.join(sorted(params)) or 'none'}")


def build_external_model(spec: str, num_classes: int, *, aux: bool = False, pretrained_backbone: Any = False,
                         norm_layer: Any = None, recompute: Any = False, **kwargs: Any) -> ExternalModel:
    """Build the network ``spec`` names for ``num_classes`` classes, wrapped in :class:`ExternalModel`.

    Every network option is applied or refused in one line (never ignored): ``aux`` (torchvision's builders),
    ``pretrained_backbone`` (torchvision's backbone weights; a factory that takes the keyword), ``norm_layer``
    (SyncBatchNorm), ``recompute`` (the backbone's blocks), builder keywords (``channels`` of ``--head-channels``
    too) where the builder, config or factory takes them; :data:`NOT_FOR_SPECS` are refused when set.

    Args:
        spec: ``torchvision:NAME``, ``transformers:PATH`` or ``package.module:factory``.
        num_classes: the number of output channels.
        aux: torchvision's auxiliary head (``aux_loss=True``).
        pretrained_backbone: ``True``: torchvision's default backbone weights (a download); default none.
        norm_layer: :class:`~encoding.nn.SyncBatchNorm` (what ``build_model(sync_bn=True)`` passes when several
            replicas or processes train): the network's BatchNorm layers are converted
            (:func:`~.spec_layers.sync_batchnorm`); ``None`` or ``nn.BatchNorm2d``: the network's own layers.
        recompute: ``"none"`` / ``False``, ``"backbone"`` or ``"all"`` (:func:`~.spec_layers.recompute_spec_network`).
        **kwargs: passed to the builder, the transformers config or the factory (those it does not take are
            refused); :data:`NOT_FOR_SPECS` (refused when set); ``stored_config``: a ``transformers:`` network's
            recorded ``config.json`` (a model folder's), built from it without reading ``PATH``.

    Raises:
        ValueError: a malformed spec, an unknown torchvision name, a missing folder or factory, an option the
            network cannot take (one line naming it).

    Example:
        >>> model = build_external_model("torchvision:lraspp_mobilenet_v3_large", 3)
        >>> model(torch.randn(1, 3, 32, 32))["out"].shape
        torch.Size([1, 3, 32, 32])
    """
    from ..nn.syncbn import SyncBatchNorm

    parsed = parse_model_spec(spec)
    for key, why in NOT_FOR_SPECS.items():
        if kwargs.pop(key, None) not in (None, False):
            raise UsageError(f"model spec {spec}: {why}")
    check_pretrained_backbone(spec, pretrained_backbone)
    synced = isinstance(norm_layer, type) and issubclass(norm_layer, SyncBatchNorm)
    if norm_layer not in (None, nn.BatchNorm2d) and not synced:
        raise UsageError(f"model spec {spec}: norm_layer={getattr(norm_layer, '__name__', norm_layer)} cannot be "
                         "applied to a network built elsewhere (its BatchNorm layers can only become SyncBatchNorm)")
    if parsed.kind == "torchvision":
        net = _torchvision(parsed.target, num_classes, aux, pretrained_backbone, **kwargs)
    elif aux:
        raise UsageError(f"model spec {spec}: --aux is for torchvision's segmentation builders")
    elif parsed.kind == "transformers":
        net = _transformers(parsed.target, num_classes, **kwargs)
    else:
        net = _factory(parsed.target, num_classes, pretrained_backbone, **kwargs)
    net = recompute_spec_network(sync_batchnorm(net, spec) if synced else net, recompute, spec)
    return ExternalModel(net, spec, num_classes)
