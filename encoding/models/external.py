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
``{"out": B x N x H x W[, "aux": ...]}`` at the input resolution. The spec is the run's ``model`` option, so the
checkpoint records it and :func:`encoding.load_model` rebuilds the network from it.
"""
from __future__ import annotations

import importlib
import inspect
import os
import warnings
from collections.abc import Mapping
from typing import Any, Dict, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import UsageError

__all__ = ["ModelSpec", "is_model_spec", "parse_model_spec", "segmentation_output", "ExternalModel",
           "build_external_model", "sync_batchnorm"]


class ModelSpec(NamedTuple):
    """A parsed model spec: ``kind`` is ``torchvision``, ``transformers`` or ``factory``; ``target`` the rest."""

    kind: str
    target: str


def is_model_spec(name: Any) -> bool:
    """Whether ``name`` is a model spec (a string with a colon) rather than a registered architecture name."""
    return isinstance(name, str) and ":" in name


def parse_model_spec(spec: str) -> ModelSpec:
    """Split ``spec`` into its kind and target.

    Raises:
        ValueError: not ``torchvision:NAME``, ``transformers:PATH`` or ``module.path:factory`` (one line, naming it).
    """
    prefix, _, target = spec.partition(":")
    if not prefix or not target:
        raise UsageError(f"model spec {spec!r}: expected torchvision:NAME, transformers:PATH or module:factory")
    if prefix in ("torchvision", "transformers"):
        return ModelSpec(prefix, target)
    if not all(part.isidentifier() for part in prefix.split(".")) or not target.isidentifier():
        raise UsageError(f"model spec {spec!r}: a factory is written package.module:function")
    return ModelSpec("factory", spec)


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
        TypeError: an output none of these describes (the message names what came back).
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
        raise TypeError(f"cannot read segmentation logits from a {type(output).__name__}{keys}: return a tensor, "
                        "a dict with 'out' or 'logits', or a tuple (logits, aux)")
    result = {"out": _resize(main, size)}
    if aux is not None:
        result["aux"] = _resize(aux, size)
    return result


class ExternalModel(nn.Module):
    """A network built from a spec, its output adapted by :func:`segmentation_output`.

    Attributes:
        net: the wrapped network (state-dict keys ``net.*``).
        spec: the spec it was built from.
    """

    def __init__(self, net: nn.Module, spec: str):
        super().__init__()
        self.net = net
        self.spec = spec

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        return segmentation_output(self.net(x), x.shape[-2:])

    def extra_repr(self) -> str:
        return f"spec={self.spec!r}"


def _torchvision(name: str, num_classes: int, aux: bool, pretrained_backbone: Any, **kwargs: Any) -> nn.Module:
    from torchvision import models
    try:
        builder = models.get_model_builder(name)
    except ValueError:
        raise UsageError(f"model spec torchvision:{name}: torchvision has no model {name!r}") from None
    params = inspect.signature(builder).parameters
    options: Dict[str, Any] = {"weights": None, "num_classes": num_classes}
    if "weights_backbone" in params:
        options["weights_backbone"] = "DEFAULT" if pretrained_backbone is True else None
    if "aux_loss" in params:
        options["aux_loss"] = aux
    elif aux:
        raise UsageError(f"model spec torchvision:{name}: this builder has no auxiliary head (drop --aux)")
    return builder(**{**options, **kwargs})


def _transformers(path: str, num_classes: int, **kwargs: Any) -> nn.Module:
    from transformers import AutoConfig, AutoModelForSemanticSegmentation
    if not os.path.isdir(path):
        raise UsageError(f"model spec transformers:{path}: no such folder (a save_pretrained folder of a "
                         "semantic-segmentation model)")
    config = AutoConfig.from_pretrained(path, num_labels=num_classes, **kwargs)
    if torch.empty(0).device.type == "meta":  # a shape check: no weights read
        return AutoModelForSemanticSegmentation.from_config(config)
    return AutoModelForSemanticSegmentation.from_pretrained(path, config=config, ignore_mismatched_sizes=True)


def _factory(spec: str, num_classes: int, **kwargs: Any) -> nn.Module:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise UsageError(f"model spec {spec}: cannot import it ({err})") from None
    net = factory(num_classes=num_classes, **kwargs)
    if not isinstance(net, nn.Module):
        raise UsageError(f"model spec {spec}: the factory returned a {type(net).__name__}, not an nn.Module")
    return net


def sync_batchnorm(net: nn.Module, spec: str) -> nn.Module:
    """``net`` with its BatchNorm layers made :class:`~encoding.nn.SyncBatchNorm` (the same parameter and buffer
    tensors, state-dict keys unchanged), as registry models are built with ``norm_layer=SyncBatchNorm`` when several
    replicas or processes train: the statistics span the whole batch.

    torch's ``BatchNorm1d/2d/3d`` and ``SyncBatchNorm`` and timm's ``BatchNormAct2d`` convert exactly. A BatchNorm
    subclass with a forward of its own, or a layer named like a batch norm that is no ``_BatchNorm`` (statistics
    computed functionally), cannot: it is left as it is and a ``UserWarning`` names it (its statistics stay per
    replica).
    """
    from ..nn.syncbn import convert_sync_batchnorm, swap_modules

    kept = {name: type(m).__name__ for name, m in net.named_modules()
            if (isinstance(m, _BatchNorm) and not _converts_exactly(m))
            or (not isinstance(m, _BatchNorm) and "batchnorm" in type(m).__name__.lower()
                and "frozen" not in type(m).__name__.lower())}  # frozen: no batch statistics
    if kept:
        names = ", ".join(f"{name} ({kind})" for name, kind in list(kept.items())[:5])
        warnings.warn(f"model spec {spec}: {len(kept)} normalisation layer(s) cannot become SyncBatchNorm and keep "
                      f"per-replica statistics: {names}{' ...' if len(kept) > 5 else ''}", stacklevel=3)
    return swap_modules(net, lambda m: convert_sync_batchnorm(m) if isinstance(m, _BatchNorm)
                        and _converts_exactly(m) else None)


def _converts_exactly(layer: _BatchNorm) -> bool:
    """torch's BatchNorm forward (or SyncBatchNorm's, ours), or timm's ``BatchNormAct2d`` (drop / act modules)."""
    from ..nn.syncbn import SyncBatchNorm

    exact = (_BatchNorm.forward, nn.SyncBatchNorm.forward, SyncBatchNorm.forward)
    return type(layer).forward in exact or any(isinstance(getattr(layer, k, None), nn.Module) for k in ("drop", "act"))


def build_external_model(spec: str, num_classes: int, *, aux: bool = False, pretrained_backbone: Any = False,
                         norm_layer: Any = None, **kwargs: Any) -> ExternalModel:
    """Build the network ``spec`` names for ``num_classes`` classes, wrapped in :class:`ExternalModel`.

    Args:
        spec: ``torchvision:NAME``, ``transformers:PATH`` or ``package.module:factory``.
        num_classes: the number of output channels.
        aux: torchvision's auxiliary head (``aux_loss=True``).
        pretrained_backbone: ``True``: torchvision's default backbone weights (a download); default none.
        norm_layer: :class:`~encoding.nn.SyncBatchNorm` (what ``build_model(sync_bn=True)`` passes when several
            replicas or processes train): the network's BatchNorm layers are converted (:func:`sync_batchnorm`);
            ``None`` or ``nn.BatchNorm2d``: the network's own layers.
        **kwargs: passed to the builder, the transformers config or the factory.

    Raises:
        ValueError: a malformed spec, an unknown torchvision name, a missing folder or factory, a ``norm_layer``
            other than these (one line).

    Example:
        >>> model = build_external_model("torchvision:lraspp_mobilenet_v3_large", 3)
        >>> model(torch.randn(1, 3, 32, 32))["out"].shape
        torch.Size([1, 3, 32, 32])
    """
    from ..nn.syncbn import SyncBatchNorm

    parsed = parse_model_spec(spec)
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
        net = _factory(parsed.target, num_classes, **kwargs)
    return ExternalModel(sync_batchnorm(net, spec) if synced else net, spec)
