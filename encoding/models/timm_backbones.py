"""Backbones from timm (the optional ``timm`` extra): PyTorch-Encoding's ResNeSt, dilated, and any timm model by name.

* ``resnest50`` / ``resnest101`` / ``resnest200`` / ``resnest269`` (:class:`ResNeStBackbone`): timm's
  ``resnest50d`` / ``resnest101e`` / ``resnest200e`` / ``resnest269e`` (PyTorch-Encoding's ResNeSt, whose ImageNet
  weights timm publishes), dilated in place at output stride 8 or 16 the way PyTorch-Encoding dilates them: in a
  dilated stage the stride of the first block, which ResNeSt keeps in its 3x3 average pool ("avd"), becomes 1 (the
  pool stays, as a 3x3 blur), the average pool of its avg-down shortcut becomes a 1x1 identity pool, and the
  split-attention 3x3 convs are dilated by the rule of :func:`~encoding.models.stages.dilate_stage` (the first keeps
  the previous dilation). At output stride 32 the stages are timm's, unchanged.
* ``timm:<name>`` (:class:`TimmBackbone`): ``timm.create_model(name, features_only=True)``, its last four feature
  levels as ``(c1, c2, c3, c4)`` (channels-last outputs, such as Swin's, turned into ``B x C x H x W``). Output
  stride 8 or 16 through timm's own ``output_stride`` argument where the family has one (ResNet/ResNeSt,
  ConvNeXt, EfficientNet, RegNet, ...); a ``ValueError`` naming the backbone where it has not (Swin, ViT-like
  models). Models with a ``strict_img_size`` option (Swin) are built without it, so any crop size works.

With ``norm_layer=encoding.nn.SyncBatchNorm`` the BatchNorm layers of the timm model are converted by
:func:`encoding.nn.convert_sync_batchnorm`, which keeps the activation and drop of timm's ``BatchNormAct2d``.

Weights: ``pretrained=False`` never touches the network; ``pretrained=True`` asks timm for its published weights
(the Hugging Face Hub, cached in ``$HF_HOME``); offline, a one-line ``ConnectionError`` (an ``OSError``, which the
scripts report in one line) names the file to download and
what to do with it. ``pretrained="file"`` loads a local timm state dict (``.pth`` or ``.safetensors``) through timm's
own loader (``weights_only=True``), with timm's key conversions.
"""
from __future__ import annotations

import contextlib
import difflib
import logging
import os
from typing import Any, Dict, Iterator, List, Tuple

from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from ..errors import UsageError
from ..names import TIMM_PREFIX, parse_backbone
from ..nn.blocks import NormLayer
from .stages import DILATIONS, StagedBackbone, dilate_stage, stage_channels
from .weights import Pretrained

__all__ = ["RESNEST", "TIMM_PREFIX", "ResNeStBackbone", "TimmBackbone", "is_timm_backbone", "get_timm_backbone",
           "create_timm_model"]

#: PyTorch-Encoding's ResNeSt names -> timm's models.
RESNEST: Dict[str, str] = {"resnest50": "resnest50d", "resnest101": "resnest101e", "resnest200": "resnest200e",
                           "resnest269": "resnest269e"}
#: Options some timm families take and others refuse; dropped where refused.
_OPTIONAL_KWARGS = {"strict_img_size": False}


def is_timm_backbone(name: str) -> bool:
    """Whether the backbone ``name`` is built with timm (a ResNeSt name or ``timm:<name>``)."""
    return name in RESNEST or name.startswith(TIMM_PREFIX)  # the prefix: parse_backbone (encoding.names)


def _import_timm(backbone: str) -> Any:
    try:
        import timm
    except ImportError:
        raise ImportError(f"backbone {backbone!r} needs timm: pip install 'encoding[timm]'") from None
    return timm


def _weights_kwargs(model: str, pretrained: Pretrained) -> Dict[str, Any]:
    if pretrained is False or pretrained is None:
        return {"pretrained": False}
    if pretrained is True:
        return {"pretrained": True}
    if isinstance(pretrained, (str, os.PathLike)):
        if not os.path.isfile(pretrained):
            raise ValueError(f"pretrained weights file {os.fspath(pretrained)!r} for timm's {model} does not exist")
        return {"pretrained": True, "pretrained_cfg_overlay": {"file": os.fspath(pretrained)}}
    raise ValueError(f"pretrained must be True, False or a file path, got {pretrained!r}")


def _download_hint(timm: Any, model: str) -> str:
    cfg = timm.models.get_pretrained_cfg(model)
    hub = getattr(cfg, "hf_hub_id", None)
    name = getattr(cfg, "hf_hub_filename", None) or "model.safetensors"
    where = f"https://huggingface.co/{hub}/resolve/main/{name}" if hub else (getattr(cfg, "url", None) or model)
    return (f"download {where} and pass its path as pretrained_backbone='path/to/{os.path.basename(where)}' "
            f"(or put it in the Hugging Face cache, $HF_HOME)")


def create_timm_model(model: str, pretrained: Pretrained = False, **kwargs: Any) -> nn.Module:
    """``timm.create_model(model, **kwargs)`` with one-line errors and this package's ``pretrained`` values.

    Args:
        model: a timm model name (``timm.list_models()``), optionally with a pretrained tag (``convnext_tiny.fb_in1k``).
        pretrained: ``False``, ``True`` (timm's published weights) or a local weights file (timm's loader).
        **kwargs: options of the timm model (``features_only``, ``output_stride``...).

    Raises:
        ValueError: unknown model (the message lists close matches), a missing or mismatching weights file, or an
            ``output_stride`` the family does not support.
        ConnectionError: ``pretrained=True`` and timm's weights cannot be fetched (offline); the message names the
            file.
    """
    timm = _import_timm(model)
    if not timm.is_model(model):
        close = difflib.get_close_matches(model, timm.list_models(), n=5, cutoff=0.6)
        raise ValueError(f"unknown timm backbone {model!r}; close matches: {', '.join(close) or 'none'} "
                         "(see timm.list_models())")
    kwargs.update(_weights_kwargs(model, pretrained))
    file = kwargs.get("pretrained_cfg_overlay", {}).get("file")
    try:
        with _missing_keys() as missing:
            network = _create(timm, model, kwargs)
    except Exception as err:  # noqa: BLE001 - download, hub, cache and loading errors become one line
        if isinstance(err, (TypeError, _Unsupported)) or not kwargs["pretrained"]:
            raise
        if file is not None:
            raise ValueError(f"weights file {file!r} does not fit timm's {model}: {_one_line(err)}") from None
        raise ConnectionError(f"could not fetch timm's pretrained weights of {model} ({_one_line(err)}); "
                              f"{_download_hint(timm, model)}") from None
    classifier = getattr(timm.models.get_pretrained_cfg(model), "classifier", None) or ()
    prefixes = tuple(f"{name}." for name in ((classifier,) if isinstance(classifier, str) else classifier))
    missing = [key for key in missing if not key.startswith(prefixes)]
    if missing and file is not None:  # timm loads feature extractors non-strictly
        raise ValueError(f"weights file {file!r} does not fit timm's {model}: missing "
                         f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    return network


class _Unsupported(UsageError):
    """An option the timm family does not have."""


def _create(timm: Any, model: str, kwargs: Dict[str, Any]) -> nn.Module:
    """``timm.create_model(model, **kwargs)`` plus those of :data:`_OPTIONAL_KWARGS` the family takes."""
    optional = dict(_OPTIONAL_KWARGS)
    while True:
        try:
            return timm.create_model(model, **kwargs, **optional)
        except TypeError as err:
            refused = [key for key in optional if f"'{key}'" in str(err)]
            if refused:
                del optional[refused[0]]
            elif "'output_stride'" in str(err):
                raise _Unsupported(f"timm backbone {model!r} has no output_stride option (no dilation): use "
                                   "output_stride=32") from None
            else:
                raise


class _Report(logging.Handler):
    def __init__(self, found: List[str]) -> None:
        super().__init__(logging.INFO)
        self.found = found

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Missing keys ("):
            self.found.extend(message[len("Missing keys ("):message.index(")")].split(", "))


@contextlib.contextmanager
def _missing_keys() -> Iterator[List[str]]:
    """The keys timm's weight loader reports missing (it logs them instead of raising, for feature models)."""
    logger, found = logging.getLogger("timm.models._builder"), []
    handler, level = _Report(found), logging.getLogger("timm.models._builder").level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:200]


def _apply_norm_layer(model: nn.Module, norm_layer: NormLayer, backbone: str) -> nn.Module:
    """``model`` with its BatchNorm layers converted to ``norm_layer`` (a SyncBatchNorm class), or unchanged."""
    if norm_layer is nn.BatchNorm2d:
        return model
    convert = getattr(norm_layer, "convert_sync_batchnorm", None)
    if convert is None:
        raise ValueError(f"backbone {backbone!r} (timm) takes norm_layer=nn.BatchNorm2d or a SyncBatchNorm class, "
                         f"got {norm_layer!r}")
    return convert(model)


def _dilate_resnest_stage(stage: nn.Sequential, previous: int, dilation: int) -> None:
    """Dilate a ResNeSt stage in place as PyTorch-Encoding does (see the module docstring)."""
    dilate_stage(stage, previous, dilation)
    for module in stage.modules():
        if isinstance(module, nn.AvgPool2d):
            if _pair(module.kernel_size) == (3, 3):  # the block's avd pool: keeps its 3x3 window, loses the stride
                module.stride = 1
            else:  # the avg-down shortcut's 2x2 pool: PE's 1x1 pool
                module.kernel_size = module.stride = 1


class ResNeStBackbone(StagedBackbone):
    """The deep stem and four stages of a timm ResNeSt, dilated like PyTorch-Encoding's, returning every stage.

    The state-dict keys are those of the timm model without ``fc`` (``conv1.0``, ``bn1``, ``layer1``...), so timm's
    ResNeSt weights load as they are.

    Args:
        resnet: a timm ``ResNet`` built with ResNeSt blocks (``timm.create_model("resnest50d")``).
        output_stride: 8, 16 or 32 (see the module docstring for the dilation).

    Attributes (``channels``, ``output_stride``) and shapes are those of
    :class:`~encoding.models.backbone.ResNetBackbone`.
    """

    def __init__(self, resnet: nn.Module, output_stride: int = 8) -> None:
        super().__init__()
        self._check_output_stride(output_stride)
        self.conv1, self.bn1, self.act1, self.maxpool = resnet.conv1, resnet.bn1, resnet.act1, resnet.maxpool
        self.layer1, self.layer2, self.layer3, self.layer4 = resnet.layer1, resnet.layer2, resnet.layer3, resnet.layer4
        self.output_stride = output_stride
        for stage, dilation in zip((self.layer3, self.layer4), DILATIONS[output_stride]):
            if dilation is not None:
                _dilate_resnest_stage(stage, *dilation)
        self.channels = tuple(stage_channels(stage) for stage in self.stages())

    def stem(self, x: Tensor) -> Tensor:
        return self.maxpool(self.act1(self.bn1(self.conv1(x))))

    def stages(self) -> Tuple[nn.Sequential, ...]:
        """``(layer1, layer2, layer3, layer4)``."""
        return self.layer1, self.layer2, self.layer3, self.layer4


class TimmBackbone(nn.Module):
    """Any timm model as a four-stage backbone: ``timm.create_model(name, features_only=True)``'s last four levels.

    Args:
        name: the timm model name (without the ``timm:`` prefix).
        output_stride: 32 (the model as timm builds it), or 16 / 8 for families with timm's ``output_stride``.
        norm_layer: ``nn.BatchNorm2d`` (timm's layers as they are) or a SyncBatchNorm class (converted).
        pretrained: ``False``, ``True`` (timm's weights) or a local weights file.

    Attributes:
        body: the timm feature extractor (its state-dict keys are timm's).
        channels: channels of ``(c1, c2, c3, c4)`` (timm's ``feature_info``).
        output_stride: stride of ``c4``.

    Raises:
        ValueError: see :func:`create_timm_model`; a model with fewer than four feature levels.
    """

    def __init__(self, name: str, output_stride: int = 32, norm_layer: NormLayer = nn.BatchNorm2d,
                 pretrained: Pretrained = False) -> None:
        super().__init__()
        if output_stride not in DILATIONS:
            raise ValueError(f"output_stride must be one of {sorted(DILATIONS)}, got {output_stride}")
        options: Dict[str, Any] = {"output_stride": output_stride} if output_stride != 32 else {}
        body = create_timm_model(name, pretrained, features_only=True, **options)
        info = body.feature_info
        if len(info.channels()) < 4:
            raise ValueError(f"timm backbone {name!r} has {len(info.channels())} feature levels; four are needed")
        self._first = len(info.channels()) - 4
        self.channels = tuple(info.channels()[self._first:])
        self.output_stride = info.reduction()[-1]
        if self.output_stride != output_stride:
            raise ValueError(f"timm backbone {name!r} gives output stride {self.output_stride}, not {output_stride}")
        self._level_modules = info.module_name()[self._first:]
        self._channels_last = str(getattr(body, "output_fmt", "NCHW")).endswith("NHWC")
        self.body = _apply_norm_layer(body, norm_layer, TIMM_PREFIX + name)

    def forward(self, x: Tensor) -> List[Tensor]:
        features = self.body(x)[self._first:]
        if self._channels_last:
            features = [f.permute(0, 3, 1, 2) for f in features]
        return list(features)

    def stages(self) -> Tuple[nn.Module, ...]:
        """The block sequence of each of the four levels (a stage's ``blocks`` where it has them): the modules whose
        children activation checkpointing (``recompute="backbone"``) wraps."""
        stages = []
        for name in self._level_modules:
            module = _submodule(self.body, name)
            blocks = getattr(module, "blocks", None)
            stages.append(blocks if isinstance(blocks, nn.Sequential) else module)
        return tuple(stages)


def _submodule(body: nn.Module, name: str) -> nn.Module:
    """The module timm's ``feature_info`` names ``name`` (``stages.0``; ``stages_0`` once flattened by timm)."""
    for candidate in (name, name.replace(".", "_")):
        try:
            return body.get_submodule(candidate)
        except AttributeError:
            continue
    raise ValueError(f"timm feature module {name!r} not found")


def get_timm_backbone(name: str, output_stride: int = 8, norm_layer: NormLayer = nn.BatchNorm2d,
                      pretrained: Pretrained = False) -> nn.Module:
    """Build a ResNeSt (``resnest50`` ... ``resnest269``) or ``timm:<name>`` backbone (see the module docstring).

    Returns:
        A :class:`ResNeStBackbone` or a :class:`TimmBackbone`.
    """
    if name in RESNEST:
        resnet = create_timm_model(RESNEST[name], pretrained)
        return ResNeStBackbone(_apply_norm_layer(resnet, norm_layer, name), output_stride)
    kind, target = parse_backbone(name)
    if kind != "timm":
        raise ValueError(f"timm backbone names are 'timm:<name>' or one of {', '.join(RESNEST)}, got {name!r}")
    return TimmBackbone(target, output_stride, norm_layer, pretrained)
