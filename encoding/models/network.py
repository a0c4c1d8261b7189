"""One description of a network: :class:`NetworkSpec`, and the one function that builds it, :meth:`NetworkSpec.build`.

Training (``train.py`` / :func:`encoding.engine.assemble.build_training`), :func:`encoding.load_model` (checkpoints),
model folders and the Hub (:mod:`encoding.inference.hub`), the memory planner (``python -m encoding.memory``), export
and the web page all describe their network with a :class:`NetworkSpec` and build it with :meth:`~NetworkSpec.build`:
so every option (``--head-channels``, ``--output-stride``, ``--recompute``, SyncBatchNorm ...) reaches every path, and
the planner plans exactly what training builds. An option a network cannot take is refused in one line by the builder
(:func:`~encoding.models.get_segmentation_model` for the registered architectures,
:func:`~encoding.models.external.build_external_model` for model specs), never ignored.

Example:
    >>> spec = NetworkSpec("deeplabv3plus", nclass=5, backbone="vgg_tiny", output_stride=8, head_channels=16)
    >>> spec.name
    'deeplabv3plus-vgg_tiny'
    >>> model = spec.build()
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Type, Union

import torch
from torch import nn

from ..errors import UsageError
from ..names import is_model_spec, network_flags, network_name
from ..nn.recompute import RECOMPUTE_POLICIES
from .factory import check_nclass

__all__ = ["NetworkSpec", "BUILD_ERRORS"]

#: What a builder raises for options it cannot build (turned into one line by :meth:`NetworkSpec.check`).
BUILD_ERRORS = (ValueError, KeyError, TypeError, NotImplementedError, RuntimeError, AttributeError)
#: The option names :meth:`NetworkSpec.from_options` reads (the training options marked ``network``, less the
#: dataset's sizes, plus the recomputation policy).
_OPTION_KEYS = ("model", "backbone", "aux", "se_loss", "output_stride", "head_channels", "recompute")


@dataclass(frozen=True)
class NetworkSpec:
    """Everything that decides which network is built (not its weights' values, nor how it is trained).

    Attributes:
        model: a registered architecture (``fcn`` ...) or a model spec (``torchvision:NAME``,
            ``transformers:PATH``, ``package.module:factory``; :mod:`~encoding.models.external`).
        nclass: output channels (the class count; 1 for a binary network).
        backbone: the backbone of a registered architecture; ``""`` for a model spec (it has none of ours).
        aux, se_loss: the auxiliary FCN head; EncNet's SE branch.
        output_stride: the backbone's output stride (``None``: the architecture's).
        head_channels: the head's width (``channels`` of the head factory; ``None``: the architecture's).
        recompute: ``"none"``, ``"backbone"`` or ``"all"`` (activation recomputation; exact).
        sync_bn: :class:`~encoding.nn.SyncBatchNorm` instead of ``nn.BatchNorm2d`` (several replicas or processes).
        pretrained_backbone: ``True`` (published ImageNet weights, a download) or a file for the backbone.
        pretrained: whole-network weights: ``"torchvision"`` or a file
            (:func:`~encoding.models.get_segmentation_model`).
        transformers_config: a ``transformers:`` network's stored ``config.json`` (a model folder): built from it,
            without the original folder.
    """

    model: str
    nclass: int
    backbone: str = "resnet50"
    aux: bool = False
    se_loss: bool = False
    output_stride: Optional[int] = None
    head_channels: Optional[int] = None
    recompute: str = "none"
    sync_bn: bool = False
    pretrained_backbone: Union[bool, str] = False
    pretrained: Union[bool, str] = False
    transformers_config: Optional[Dict[str, Any]] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.recompute in (False, None):  # the old spelling of "none"
            object.__setattr__(self, "recompute", "none")
        if self.recompute not in RECOMPUTE_POLICIES:
            raise UsageError(f"--recompute {self.recompute}: valid policies are {', '.join(RECOMPUTE_POLICIES)}")
        if is_model_spec(self.model):
            object.__setattr__(self, "backbone", "")  # a spec network has no backbone of ours
        elif not self.backbone:
            object.__setattr__(self, "backbone", "resnet50")
        check_nclass(self.nclass, self.flags)

    @classmethod
    def from_options(cls, options: Union[Mapping[str, Any], Any], nclass: int, **overrides: Any) -> "NetworkSpec":
        """The network of run options: a mapping or an object with attributes (``TrainingConfig``, an
        ``argparse.Namespace``, a checkpoint's recorded options), reading ``model``, ``backbone``, ``aux``,
        ``se_loss``, ``output_stride``, ``head_channels`` and ``recompute`` where present; ``overrides`` set the
        other fields (``sync_bn``, ``pretrained_backbone`` ...)."""
        get = options.get if isinstance(options, Mapping) else (lambda key: getattr(options, key, None))
        values = {key: get(key) for key in _OPTION_KEYS if get(key) is not None}
        values = {k: bool(v) if k in ("aux", "se_loss") else v for k, v in values.items()}
        return cls(nclass=nclass, **{**values, **overrides})

    def replace(self, **changes: Any) -> "NetworkSpec":
        """A copy with ``changes`` (``spec.replace(recompute="all")``)."""
        return dataclasses.replace(self, **changes)

    @property
    def name(self) -> str:
        """How banners, reports and errors name the network: ``fcn-resnet50``; a model spec alone."""
        return network_name(self.model, self.backbone)

    @property
    def flags(self) -> str:
        """The command-line options that give this network (what errors quote)."""
        text = network_flags(self.model, self.backbone)
        text += f" --output-stride {self.output_stride}" if self.output_stride else ""
        return text + (f" --head-channels {self.head_channels}" if self.head_channels else "")

    def build(self, device: Optional[Union[str, torch.device]] = None) -> nn.Module:
        """The network, on ``device`` (``None``: where it was built, the CPU or the current default device).

        Raises:
            ValueError: an option the network cannot take, an unknown name (one line; :meth:`check` adds the
                flags).
        """
        from ..nn.syncbn import SyncBatchNorm
        from .factory import get_segmentation_model

        options: Dict[str, Any] = {"channels": self.head_channels} if self.head_channels else {}
        if self.transformers_config is not None:
            options["stored_config"] = dict(self.transformers_config)
        model = get_segmentation_model(self.model, backbone=self.backbone or "resnet50", aux=self.aux,
                                       se_loss=self.se_loss, pretrained=self.pretrained, nclass=self.nclass,
                                       norm_layer=SyncBatchNorm if self.sync_bn else nn.BatchNorm2d,
                                       output_stride=self.output_stride, pretrained_backbone=self.pretrained_backbone,
                                       recompute=self.recompute, **options)
        return model if device is None else model.to(device)

    def check(self, error: Type[Exception] = UsageError) -> nn.Module:
        """Build the network on the ``meta`` device (no memory, no weights, no download) and return it, so that
        every late error of the constructors is found before any work.

        Raises:
            error: one line quoting :attr:`flags` and the builder's reason; a ``pretrained_backbone`` file that is
                not there.
        """
        weights = self.pretrained_backbone
        if isinstance(weights, (str, os.PathLike)) and not os.path.isfile(weights):
            raise error(f"--pretrained-backbone {os.fspath(weights)}: no such weights file")
        try:
            with torch.device("meta"):
                network = self.replace(pretrained=False, pretrained_backbone=False).build()
            if is_model_spec(self.model):  # where the build would refuse the backbone's weights (nothing loaded)
                from .external import check_pretrained_backbone
                check_pretrained_backbone(self.model, weights)
            return network
        except BUILD_ERRORS as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise error(f"{self.flags}: {reason}") from None

    def parameter_bytes(self) -> int:
        """The bytes of the network's parameters (counted on the ``meta`` device)."""
        return sum(p.numel() * p.element_size() for p in self.check().parameters())
