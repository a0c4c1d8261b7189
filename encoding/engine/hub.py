"""Whole models to share: a folder (or a Hugging Face Hub repository) that rebuilds a trained network with nothing
else — no registered dataset, no code of the run, and nothing unpickled.

:func:`save_pretrained` writes ``config.json`` (the :class:`~encoding.engine.loading.ModelInfo`: the model spec or
architecture and its options, the classes, colours, mean/std, sizes; for a ``transformers:`` model its Hugging Face
config too), ``model.safetensors`` and a ``README.md`` model card; :func:`load_pretrained` (what
:func:`encoding.load_model` calls for a folder or a ``user/repo`` id) reads them back, the weights with
``safetensors``; :func:`push_to_hub` uploads the folder. The Hub needs the optional extra ``hub``
(``pip install encoding[hub]``: ``huggingface_hub`` and ``safetensors``).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Any, Dict, Optional, Union

import torch
from torch import nn

from ..models import get_segmentation_model
from ..models.external import ExternalModel, parse_model_spec
from ..utils.files import atomic_write, makedirs
from .loading import SOURCE_READERS, ModelInfo, model_info

__all__ = ["CONFIG_NAME", "WEIGHTS_NAME", "save_pretrained", "load_pretrained", "push_to_hub", "is_pretrained_source"]

#: The files of a shared model.
CONFIG_NAME, WEIGHTS_NAME, CARD_NAME = "config.json", "model.safetensors", "README.md"
_FORMAT = "encoding-model"
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise ImportError("sharing models needs safetensors: pip install encoding[hub]") from None
    return safetensors.torch


def save_pretrained(model: nn.Module, directory: Union[str, os.PathLike], *,
                    metrics: Optional[Dict[str, Any]] = None, config: Optional[Dict[str, Any]] = None) -> str:
    """Write ``model`` (built by :func:`encoding.load_model` or carrying a ``model.info``) as a shareable folder.

    Args:
        model: the network; its :class:`~encoding.engine.loading.ModelInfo` says how to rebuild it.
        directory: the folder (created; each file is written atomically, other files in it are left alone).
        metrics: the run's metrics for the model card (e.g. ``{"mIoU": 0.71, "pixAcc": 0.93}``).
        config: the run's configuration for the model card.

    Returns:
        The folder.

    Raises:
        ValueError: ``model`` carries no ModelInfo.
    """
    info = model_info(model)
    directory = makedirs(os.fspath(directory))
    data: Dict[str, Any] = {"format": _FORMAT, "version": 1, "info": info.to_json()}
    net = getattr(model, "net", None)
    if isinstance(model, ExternalModel) and hasattr(getattr(net, "config", None), "to_dict"):
        data["transformers_config"] = net.config.to_dict()
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    atomic_write(os.path.join(directory, WEIGHTS_NAME), _safetensors().save(tensors, metadata={"format": "pt"}))
    atomic_write(os.path.join(directory, CONFIG_NAME), json.dumps(data, indent=2, default=str) + "\n")
    atomic_write(os.path.join(directory, CARD_NAME), model_card(info, metrics, config))
    return directory


def model_card(info: ModelInfo, metrics: Optional[Dict[str, Any]] = None,
               config: Optional[Dict[str, Any]] = None) -> str:
    """The ``README.md`` of a shared model: its classes and colours, the run's metrics and configuration."""
    name = info.options.get("model", "model")
    lines = ["---", "library_name: encoding", "tags:", "- semantic-segmentation", "- encoding", "---", "",
             f"# {name} ({info.options.get('backbone', '')}) on {info.dataset}", "",
             f"{info.num_classes} classes; inputs normalised with mean {list(info.mean)} and std {list(info.std)}; "
             f"trained around {info.base_size} px with {info.crop_size} px crops.", "",
             "| id | class | colour |", "|---|---|---|"]
    lines += [f"| {i} | {c} | {tuple(p)} |" for i, (c, p) in enumerate(zip(info.classes, info.palette))]
    if metrics:
        lines += ["", "## Metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in metrics.items()]
    lines += ["", "## Use", "", "```python", "import encoding", "",
              'model = encoding.load_model("THIS_FOLDER_OR_USER/REPO")', 'labels = encoding.segment(model, "image.jpg")',
              "```"]
    if config:
        lines += ["", "## Configuration", "", "```json", json.dumps(config, indent=2, default=str), "```"]
    return "\n".join(lines) + "\n"


def is_pretrained_source(source: str) -> bool:
    """Whether :func:`encoding.load_model` should read ``source`` as a shared model: a folder holding
    ``config.json``, or (when no such path exists) a Hub id ``user/repo``."""
    if os.path.isdir(source):
        return os.path.isfile(os.path.join(source, CONFIG_NAME))
    return not os.path.exists(source) and bool(_REPO_ID.fullmatch(source)) and \
        not source.endswith((".pth", ".pt", ".tar", ".ckpt", ".safetensors", ".bin"))


def _snapshot(repo_id: str, revision: Optional[str]) -> str:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ImportError(f"reading {repo_id!r} from the Hugging Face Hub needs huggingface_hub: "
                          "pip install encoding[hub]") from None
    try:
        return snapshot_download(repo_id, revision=revision, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, CARD_NAME])
    except Exception as err:  # offline and not cached, no such repository, no network: one line naming it
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(f"{repo_id!r} is no file or folder here, and the Hugging Face Hub repository of "
                                f"that name cannot be read ({type(err).__name__}: {reason})") from None


def _build(info: ModelInfo, data: Dict[str, Any]) -> nn.Module:
    options = info.options
    name = options.get("model")
    if not name:
        raise ValueError("config.json names no model")
    hf_config = data.get("transformers_config")
    if hf_config is not None and parse_model_spec(name).kind == "transformers":
        from transformers import AutoConfig, AutoModelForSemanticSegmentation
        config = AutoConfig.for_model(**hf_config)
        return ExternalModel(AutoModelForSemanticSegmentation.from_config(config), name)
    head = {"channels": options["head_channels"]} if options.get("head_channels") else {}
    return get_segmentation_model(name, dataset=info.dataset, backbone=options.get("backbone") or "resnet50",
                                  aux=bool(options.get("aux")), se_loss=bool(options.get("se_loss")),
                                  nclass=info.out_channels, output_stride=options.get("output_stride"), **head)


def load_pretrained(source: Union[str, os.PathLike], *, device: Optional[Union[str, torch.device]] = None,
                    revision: Optional[str] = None) -> nn.Module:
    """The model of a :func:`save_pretrained` folder or Hub repository, in eval mode, with its ``model.info``.

    Args:
        source: a folder, or a Hub id ``user/repo`` (read through ``huggingface_hub``'s cache; ``HF_HUB_OFFLINE=1``
            reads the cache only).
        device: where to put the model (default: the CPU).
        revision: a Hub branch, tag or commit.

    Raises:
        ValueError: a folder that is not a shared model, or weights that do not fit the network (one line, naming
            the folder).
        FileNotFoundError: a Hub id that cannot be read (offline and not cached, no such repository).
    """
    source = os.fspath(source)
    folder = source if os.path.isdir(source) else _snapshot(source, revision)
    path = os.path.join(folder, CONFIG_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a shared encoding model ({err})") from None
    if data.get("format") != _FORMAT:
        raise ValueError(f"{path}: not a shared encoding model (format {data.get('format')!r})")
    fields = data["info"]
    info = ModelInfo(**{**fields, "classes": tuple(fields["classes"]), "mean": tuple(fields["mean"]),
                        "std": tuple(fields["std"]), "palette": tuple(tuple(c) for c in fields["palette"])})
    model = _build(info, data)
    state = _safetensors().load_file(os.path.join(folder, WEIGHTS_NAME))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{folder}: the weights do not fit {info.options.get('model')}: "
                         f"{str(err).splitlines()[0]}") from None
    model.info = info
    return (model if device is None else model.to(device)).eval()


def push_to_hub(model: nn.Module, repo_id: str, *, private: bool = False, token: Optional[str] = None,
                metrics: Optional[Dict[str, Any]] = None, config: Optional[Dict[str, Any]] = None,
                commit_message: str = "Upload encoding model") -> str:
    """:func:`save_pretrained` into a temporary folder and upload it to the Hub repository ``repo_id`` (created
    when missing).

    Returns:
        The URL of the commit.
    """
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise ImportError("push_to_hub needs huggingface_hub: pip install encoding[hub]") from None
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder, metrics=metrics, config=config)
        return str(api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message))


SOURCE_READERS.append((is_pretrained_source, load_pretrained))  # encoding.load_model(folder | "user/repo")
