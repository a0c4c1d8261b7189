"""Every name of a network, parsed in one place (as timm's ``parse_model_name``): model specs, timm backbones and
Hub ids.

* a **model** name is a registered architecture (``fcn``) or a *model spec* with a prefix: ``torchvision:NAME``,
  ``transformers:PATH`` or ``package.module:factory`` (:func:`parse_model_spec`); ``timm:NAME`` is refused as a
  model with the hint that it is a backbone;
* a **backbone** name is the toolkit's (``resnet50``, ``vgg_tiny`` ...) or ``timm:NAME`` for any timm model
  (:func:`parse_backbone`);
* a **Hub id** ``user/repo`` names a shared model on the Hugging Face Hub (:func:`is_hub_id`).

Which of these names code to import (a ``module:factory`` spec, :func:`names_code`) is decided here too, for the trust
gate (:mod:`encoding.utils.trust`). A leaf module: it imports nothing of the package but its errors.
"""
from __future__ import annotations

import os
import re
from typing import Any, NamedTuple

from .errors import UsageError

__all__ = ["ModelSpec", "TIMM_PREFIX", "BUILT_IN_SPECS", "is_model_spec", "parse_model_spec", "parse_backbone",
           "names_code", "names_path", "absolute_spec", "network_name", "network_flags", "is_hub_id"]

#: Prefix of the backbone names that build any timm model: ``"timm:convnext_tiny"``.
TIMM_PREFIX = "timm:"
#: Model-spec prefixes of the networks built by the libraries themselves (no code named by the data is imported).
BUILT_IN_SPECS = ("torchvision", "transformers")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class ModelSpec(NamedTuple):
    """A parsed name: ``kind`` is ``torchvision``, ``transformers`` or ``factory`` (a model spec), ``timm`` or
    ``builtin`` (a backbone); ``target`` is what follows the prefix (a factory's whole ``module:function``)."""

    kind: str
    target: str


def is_model_spec(name: Any) -> bool:
    """Whether ``name`` is a model spec (a string with a colon) rather than a registered architecture name."""
    return isinstance(name, str) and ":" in name


def parse_model_spec(spec: str) -> ModelSpec:
    """Split the model spec ``spec`` into its kind and target.

    Raises:
        UsageError: not ``torchvision:NAME``, ``transformers:PATH`` or ``module.path:factory`` (one line, naming
            it; ``timm:NAME`` with the hint that it is a backbone).
    """
    prefix, _, target = spec.partition(":")
    if not prefix or not target:
        raise UsageError(f"model spec {spec!r}: expected torchvision:NAME, transformers:PATH or module:factory")
    if prefix in BUILT_IN_SPECS:
        return ModelSpec(prefix, target)
    if prefix + ":" == TIMM_PREFIX:
        raise UsageError(f"model spec {spec!r}: a timm model is a backbone: --model ARCH --backbone {spec} (e.g. "
                         f"--model fcn --backbone {spec})")
    if not all(part.isidentifier() for part in prefix.split(".")) or not target.isidentifier():
        raise UsageError(f"model spec {spec!r}: a factory is written package.module:function")
    return ModelSpec("factory", spec)


def parse_backbone(name: str) -> ModelSpec:
    """``("timm", NAME)`` for ``timm:NAME``, ``("builtin", name)`` for the toolkit's own names.

    Raises:
        UsageError: ``timm:`` without a name, or another prefix (one line, naming it).
    """
    prefix, colon, target = name.partition(":")
    if not colon:
        return ModelSpec("builtin", name)
    if prefix + ":" != TIMM_PREFIX or not target:
        raise UsageError(f"backbone {name!r}: a prefixed backbone is {TIMM_PREFIX}<name of a timm model>")
    return ModelSpec("timm", target)


def names_code(spec: Any) -> bool:
    """Whether the model name ``spec`` makes the toolkit import code of someone's: a ``package.module:factory``
    spec (it imports that module and calls the factory). Registered architectures, ``torchvision:`` /
    ``transformers:`` networks and ``timm:`` names import nothing that the data names."""
    return is_model_spec(spec) and spec.partition(":")[0] not in BUILT_IN_SPECS + (TIMM_PREFIX[:-1],)


def names_path(spec: Any) -> bool:
    """Whether the model name ``spec`` reads a folder of this machine (``transformers:PATH``): a web request may not
    name one (its files, or whether it exists, are the server's)."""
    return is_model_spec(spec) and spec.partition(":")[0] == "transformers"


def absolute_spec(spec: str) -> str:
    """``spec`` with a relative ``transformers:PATH`` made absolute (what a run records, so that its checkpoint
    works from another folder); any other name unchanged."""
    prefix, colon, target = spec.partition(":")
    if prefix == "transformers" and colon and target and not os.path.isabs(target):
        return f"transformers:{os.path.abspath(target)}"
    return spec


def network_name(model: str, backbone: Any = None) -> str:
    """How banners, reports and errors name a network: ``fcn-resnet50``; a spec alone (it has no backbone of ours,
    whatever ``--backbone`` says)."""
    return model if is_model_spec(model) or not backbone else f"{model}-{backbone}"


def network_flags(model: str, backbone: Any = None) -> str:
    """The command-line options that name a network: ``--model fcn --backbone resnet50``; a spec: ``--model SPEC``."""
    return f"--model {model}" if is_model_spec(model) or not backbone else f"--model {model} --backbone {backbone}"


def is_hub_id(text: Any) -> bool:
    """Whether ``text`` has the form of a Hugging Face Hub repository id, ``user/repo``."""
    return isinstance(text, str) and bool(_HUB_ID.fullmatch(text))
