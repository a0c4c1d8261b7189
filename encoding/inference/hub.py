"""Whole models to share: a folder (or a Hugging Face Hub repository) that rebuilds a trained network with nothing
else — no registered dataset, no code of the run, and nothing unpickled.

:func:`save_pretrained` writes ``config.json`` (the :class:`~encoding.inference.loading.ModelInfo`: the model spec or
architecture and its options, the classes, colours, mean/std, sizes; for a ``transformers:`` model its Hugging Face
config too), ``model.safetensors`` and a ``README.md`` model card; :func:`load_pretrained` (what
:func:`encoding.load_model` calls for a folder or a ``user/repo`` id) reads them back, the weights with
``safetensors``; :func:`push_to_hub` uploads the folder. The Hub needs the optional extra ``hub``
(``pip install encoding[hub]``: ``huggingface_hub`` and ``safetensors``).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Union

import torch
from torch import nn

from ..errors import EXIT_USAGE, EncodingError, MissingDependency, UsageError
from ..models.external import ExternalModel
from ..models.network import NetworkSpec
from ..names import is_hub_id, network_name
from ..utils.checkpoint import CheckpointError, check_state_fits, unwrap_model
from ..utils.files import atomic_write, makedirs, refuse_own_input, source_files
from ..utils.trust import OPT_IN, UntrustedCode, check_trusted, code_named, reading
from .loading import SOURCE_READERS, ModelInfo, attach_info, check_network_options, model_info, network_files, \
    to_import
from .sources import input_files
from .safetensors_header import MAX_HEADER_BYTES, bad_folder as _bad, file_size, read_bytes, read_safetensors_header

__all__ = ["MODEL_CONFIG_NAME", "WEIGHTS_NAME", "MAX_CONFIG_BYTES", "MAX_HEADER_BYTES", "save_pretrained",
           "load_pretrained", "read_safetensors_header", "push_to_hub", "HubUnavailable", "is_pretrained_source"]

#: The files of a shared model.
MODEL_CONFIG_NAME, WEIGHTS_NAME, CARD_NAME = "config.json", "model.safetensors", "README.md"
_FORMAT = "encoding-model"


def _safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise MissingDependency("sharing models needs safetensors: pip install encoding[hub]") from None
    return safetensors.torch


def save_pretrained(model: nn.Module, directory: Union[str, os.PathLike], *,
                    metrics: Optional[Dict[str, Any]] = None, config: Optional[Dict[str, Any]] = None) -> str:
    """Write ``model`` (built by :func:`encoding.load_model` or carrying a ``model.info``) as a shareable folder.

    Args:
        model: the network; its :class:`~encoding.inference.loading.ModelInfo` says how to rebuild it.
        directory: the folder (created; each file is written atomically, other files in it are left alone).
        metrics: the run's metrics for the model card (e.g. ``{"mIoU": 0.71, "pixAcc": 0.93}``).
        config: the run's configuration for the model card.

    Returns:
        The folder.

    Raises:
        ValueError: ``model`` carries no ModelInfo; weights that are not float32 (a ``.half()`` model: save
            ``model.float()``); a ``model.info`` that :func:`load_pretrained` would refuse (no ``model``, or a
            network whose keys or shapes are not the weights': another architecture, ``aux`` or backbone); a
            ``directory`` that is a file, the folder a ``transformers:PATH`` network is built from, or a file the
            model was loaded from (each would be overwritten). One line each, before anything is written.
    """
    network = _unwrapped(model)  # torch.compile / DataParallel wrappers: the network's own keys
    info = model_info(model if isinstance(getattr(model, "info", None), ModelInfo) else network)
    state = network.state_dict()
    _check_float32(state, os.fspath(directory))
    data: Dict[str, Any] = {"format": _FORMAT, "version": 1, "info": info.to_json()}
    net = getattr(network, "net", None)
    if isinstance(network, ExternalModel) and hasattr(getattr(net, "config", None), "to_dict"):
        data["transformers_config"] = net.config.to_dict()
    _check_loadable(os.fspath(directory), json.loads(json.dumps(data, default=str)), state)  # as it will be read
    directory = _target(os.fspath(directory), info, input_files(model))
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items()}
    weights = _safetensors().save(tensors, metadata={"format": "pt"})
    data["weights_sha256"] = hashlib.sha256(weights).hexdigest()  # a config.json read with other weights is refused
    atomic_write(os.path.join(directory, WEIGHTS_NAME), weights)
    atomic_write(os.path.join(directory, MODEL_CONFIG_NAME), json.dumps(data, indent=2, default=str) + "\n")
    atomic_write(os.path.join(directory, CARD_NAME), model_card(info, metrics, config))
    return directory


def _unwrapped(model: nn.Module) -> nn.Module:
    """The network inside ``torch.compile`` (``_orig_mod``) and ``DataParallel`` / DDP (``module``) wrappers."""
    while True:
        inner = unwrap_model(getattr(model, "_orig_mod", model))
        if inner is model:
            return model
        model = inner


def _check_float32(state: Dict[str, torch.Tensor], directory: str) -> None:
    """Refuse floating weights of another dtype than float32, the dtype :func:`load_pretrained` builds (and checks)
    the network in: a folder of float16 weights would be refused by its own loader."""
    wrong = [f"{k} ({v.dtype})" for k, v in state.items() if v.is_floating_point() and v.dtype != torch.float32]
    if wrong:
        raise UsageError(f"save_pretrained({directory}): a shared model holds float32 weights, these are not: "
                         f"{', '.join(wrong[:3])}{' ...' if len(wrong) > 3 else ''}; save model.float()")


def _target(directory: str, info: ModelInfo, inputs: List[str]) -> str:
    """``directory`` created, once it is known that it is no file, not the folder of a ``transformers:PATH``
    network (the files written would replace its config.json and weights), and that no file written is one of
    ``inputs`` (the files the model was loaded from: :func:`~encoding.inference.sources.input_files`)."""
    directory = os.path.expanduser(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UsageError(f"save_pretrained({directory}): that is a file; give a folder (created when missing)")
    written = [os.path.join(directory, name) for name in (WEIGHTS_NAME, MODEL_CONFIG_NAME, CARD_NAME)]
    try:
        refuse_own_input(written, network_files(info.options.get("model")) + inputs, "writing")
        return makedirs(directory)
    except (ValueError, OSError) as err:
        raise UsageError(f"save_pretrained({directory}): {str(err).splitlines()[0]}") from None


def model_card(info: ModelInfo, metrics: Optional[Dict[str, Any]] = None,
               config: Optional[Dict[str, Any]] = None) -> str:
    """The ``README.md`` of a shared model: its classes and colours, the run's metrics and configuration."""
    name = info.options.get("model", "model")
    lines = ["---", "library_name: encoding", "tags:", "- semantic-segmentation", "- encoding", "---", "",
             f"# {network_name(name, info.options.get('backbone'))} on {info.dataset}", "",
             f"{info.num_classes} classes; inputs normalised with mean {list(info.mean)} and std {list(info.std)}; "
             f"trained around {info.base_size} px with {info.crop_size} px crops.", "",
             "| id | class | colour |", "|---|---|---|"]
    lines += [f"| {i} | {c} | {tuple(p)} |" for i, (c, p) in enumerate(zip(info.classes, info.palette))]
    if metrics:
        lines += ["", "## Metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in metrics.items()]
    lines += ["", "## Use", "", "```python", "import encoding", "",
              'model = encoding.load_model("THIS_FOLDER_OR_USER/REPO")',
              'labels = encoding.segment(model, "image.jpg")',
              "```"]
    named = code_named(info.options)
    if named:
        lines += ["", "## Code", "", "This model names code that is not part of `encoding`: "
                  + "; ".join(f"{what} (module `{module}`)" for what, module in named)
                  + f". Loading it needs that code importable and the opt-in {OPT_IN}: "
                  "`encoding.load_model(..., trust_code=True)`. Read the code before you trust it."]
    if config:
        lines += ["", "## Configuration", "", "```json", json.dumps(config, indent=2, default=str), "```"]
    return "\n".join(lines) + "\n"


def is_pretrained_source(source: str) -> bool:
    """Whether :func:`encoding.load_model` should read ``source`` as a shared model: a folder (one without
    ``config.json`` is refused by :func:`load_pretrained` in one line), or (when no such path exists) a Hub id
    ``user/repo``."""
    if os.path.isdir(source):
        return True
    return not os.path.exists(source) and is_hub_id(source) and \
        not source.endswith((".pth", ".pt", ".tar", ".ckpt", ".safetensors", ".bin"))


def _snapshot(repo_id: str, revision: Optional[str]) -> str:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise MissingDependency(f"reading {repo_id!r} from the Hugging Face Hub needs huggingface_hub: "
                                "pip install encoding[hub]") from None
    try:
        return snapshot_download(repo_id, revision=revision,
                                 allow_patterns=[MODEL_CONFIG_NAME, WEIGHTS_NAME, CARD_NAME])
    except Exception as err:  # offline and not cached, no such repository, no network: one line naming it
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(f"{repo_id!r} is no file or folder here, and the Hugging Face Hub repository of "
                                f"that name cannot be read ({type(err).__name__}: {reason})") from None


#: The largest ``config.json`` read.
MAX_CONFIG_BYTES = 16 << 20


def _read_config(folder: str) -> Dict[str, Any]:
    """``config.json``, bounded in size; a damaged file is one line naming the folder."""
    path = os.path.join(folder, MODEL_CONFIG_NAME)
    if not os.path.exists(path):
        raise _bad(folder, f"no {MODEL_CONFIG_NAME}: a folder written by save_pretrained holds one (a checkpoint is "
                   "a file: give its path)")
    try:
        if os.path.getsize(path) > MAX_CONFIG_BYTES:
            raise _bad(folder, f"{MODEL_CONFIG_NAME} is larger than {MAX_CONFIG_BYTES >> 20} MiB")
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _bad(folder, f"{MODEL_CONFIG_NAME}: {str(err).splitlines()[0]}") from None
    except RecursionError:
        raise _bad(folder, f"{MODEL_CONFIG_NAME} is nested too deeply") from None
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise _bad(folder, f"{MODEL_CONFIG_NAME} is no {_FORMAT} config (format {str(repr(found))[:40]})")
    return data


def _read_info(folder: str, data: Dict[str, Any]) -> ModelInfo:
    """The :class:`ModelInfo` of ``config.json``'s ``info``, every field checked."""
    fields = data.get("info")
    if not isinstance(fields, dict):
        raise _bad(folder, f"{MODEL_CONFIG_NAME} has no 'info' object")
    try:
        classes, palette = fields["classes"], fields["palette"]
        ok = (isinstance(classes, list) and isinstance(palette, list) and all(isinstance(c, list) for c in palette)
              and all(isinstance(fields.get(k), list) and len(fields[k]) == 3
                      and all(isinstance(v, (int, float)) for v in fields[k]) for k in ("mean", "std"))
              and isinstance(fields.get("options", {}), dict) and isinstance(fields.get("dataset"), str))
        if not ok:
            raise TypeError("classes, palette, mean, std, options or dataset of the wrong type or length")
        info = ModelInfo(**{**fields, "classes": tuple(classes), "mean": tuple(fields["mean"]),
                            "std": tuple(fields["std"]), "palette": tuple(tuple(c) for c in palette)})
        check_network_options(info.options, "options")
    except (KeyError, TypeError, ValueError) as err:
        raise _bad(folder, f"{MODEL_CONFIG_NAME} 'info': {str(err).splitlines()[0] if str(err) else type(err).__name__}"
                   ) from None
    if not isinstance(info.options.get("model"), str) or not info.options["model"]:
        raise _bad(folder, f"{MODEL_CONFIG_NAME} names no model")
    return info


def _keyed_as(state: Dict[str, torch.Tensor], own: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``state`` under ``own``'s keys once :func:`check_state_fits` accepted it: its keys, or ``module.`` + its keys
    (the weights of a ``DataParallel`` model, whose prefix ``check_state_fits`` drops too)."""
    return state if state.keys() == own.keys() else {k[len("module."):]: v for k, v in state.items()}


def _check_fits(model: nn.Module, stored: Dict[str, torch.Tensor], folder: str, name: str) -> None:
    """Refuse stored tensors of other keys, shapes or dtypes than ``model``'s (a ``meta`` twin)."""
    try:
        check_state_fits(model, stored, source=WEIGHTS_NAME)
    except CheckpointError as err:
        raise UsageError(f"{folder}: the weights do not fit {name}: {str(err).splitlines()[0]}") from None
    own = model.state_dict()
    stored = _keyed_as(stored, own)
    wrong = [f"{k} ({stored[k].dtype}, expected {own[k].dtype})" for k in own if stored[k].dtype != own[k].dtype]
    if wrong:
        raise _bad(folder, f"{WEIGHTS_NAME} holds tensors of the wrong dtype: {', '.join(wrong[:3])}")


def _network(info: ModelInfo, data: Dict[str, Any]) -> NetworkSpec:
    """The network ``config.json`` records (a ``transformers:`` network with its stored config)."""
    stored = data.get("transformers_config") if info.options["model"].startswith("transformers:") else None
    return NetworkSpec.from_options(info.options, info.out_channels, recompute="none", transformers_config=stored)


def _check_network(info: ModelInfo, data: Dict[str, Any], stored: Dict[str, torch.Tensor], folder: str) -> None:
    """Refuse a ``config.json`` whose network, built as a ``meta`` twin (no memory), has not the stored tensors'
    keys, shapes and dtypes: an edited ``head_channels`` is refused before anything is allocated."""
    name = info.options["model"]
    try:
        with torch.device("meta"):
            twin = _network(info, data).build()
    except UntrustedCode:
        raise
    except (ValueError, KeyError, TypeError, NotImplementedError, AttributeError) as err:
        raise _bad(folder, f"its network ({name}) cannot be built: "
                   f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    _check_fits(twin, stored, folder, name)


def _check_loadable(directory: str, data: Dict[str, Any], state: Dict[str, torch.Tensor]) -> None:
    """Refuse to save a folder that :func:`load_pretrained` would refuse: the loader's own checks of ``config.json``
    (``data``, as it will be read back) and of the weights (``state``) against the network it names (a
    ``module:factory`` network only when its module is imported already: saving imports no code).

    Raises:
        UsageError: one line naming ``directory`` and the loader's reason (before anything is written).
    """
    try:
        info = _read_info(directory, data)
        if all(module in sys.modules for _, module in code_named({"model": info.options["model"]})):
            _check_network(info, data, state, directory)  # (saving imports no code the process has not imported)
    except UsageError as err:
        raise UsageError(f"save_pretrained({directory}): its loader would refuse the folder ({err}); model.info "
                         "must name the network and its options, e.g. ModelInfo.of_dataset(dataset, model=..., "
                         "backbone=..., aux=...)") from None


def load_pretrained(source: Union[str, os.PathLike], *, device: Optional[Union[str, torch.device]] = None,
                    revision: Optional[str] = None, trust_code: bool = False) -> nn.Module:
    """The model of a :func:`save_pretrained` folder or Hub repository, in eval mode, with its ``model.info``.

    Everything is checked before the network is built: ``config.json`` (bounded, every field), the code it names
    (refused without ``trust_code``), the safetensors header (keys, shapes and dtypes against the network built on
    the ``meta`` device); then the network is built and the weights read with ``safetensors`` (nothing unpickled).

    Args:
        source: a folder, or a Hub id ``user/repo`` (read through ``huggingface_hub``'s cache; ``HF_HUB_OFFLINE=1``
            reads the cache only).
        device: where to put the model (default: the CPU).
        revision: a Hub branch, tag or commit (a local folder has none: refused).
        trust_code: import the code that ``config.json`` names (a ``module:factory`` network, a dataset class of
            the author's); without it such a folder is refused (``encoding.utils.trust``).

    Raises:
        ValueError: a folder that is not a shared model, a damaged one, or weights that do not fit the network (one
            ``UsageError`` line, naming the folder).
        UntrustedCode: ``config.json`` names code and ``trust_code`` is not set.
        FileNotFoundError: a Hub id that cannot be read (offline and not cached, no such repository).
    """
    source = os.fspath(source)
    if os.path.isdir(source) and revision is not None:
        raise UsageError(f"load_pretrained({source!r}, revision={str(repr(revision))[:60]}): {source} is a local "
                         "folder, which has no revisions; revision= picks one of a Hub repository user/repo")
    folder = source if os.path.isdir(source) else _snapshot(source, revision)
    data = _read_config(folder)
    info = _read_info(folder, data)
    check_trusted(to_import({**info.options, "dataset": info.dataset}), folder, trust_code)
    if data.get("transformers_config") is not None and not isinstance(data["transformers_config"], dict):
        raise _bad(folder, f"{MODEL_CONFIG_NAME}: 'transformers_config' is no object")
    size = file_size(os.path.join(folder, WEIGHTS_NAME))
    stored = read_safetensors_header(os.path.join(folder, WEIGHTS_NAME), folder)  # and that size
    with reading(folder, trust_code):
        _check_network(info, data, stored, folder)
        model = _network(info, data).build()
    reader = _safetensors()
    from safetensors import SafetensorError
    weights = _weights_bytes(folder, data.get("weights_sha256"), size)
    try:
        state = reader.load(weights)
        model.load_state_dict(_keyed_as(state, model.state_dict()), strict=True)
    except (OSError, RuntimeError, ValueError, SafetensorError) as err:
        raise _bad(folder, f"{WEIGHTS_NAME}: {str(err).splitlines()[0]}") from None
    return attach_info(model, info, device, source_files(folder))


def _weights_bytes(folder: str, digest: Any, size: int) -> bytes:
    """The bytes of the folder's weights (:func:`read_bytes`: the ``size`` checked), refused when ``config.json``
    records another SHA-256 than theirs (weights of another save: one interrupted between its files, or files copied
    from two folders). A folder recording no digest (saved before it was recorded) is read as it is."""
    weights = read_bytes(os.path.join(folder, WEIGHTS_NAME), folder, size)
    if digest is not None and digest != hashlib.sha256(weights).hexdigest():
        raise _bad(folder, f"{WEIGHTS_NAME} is not the file {MODEL_CONFIG_NAME} was saved with (its weights_sha256 "
                   "differs: another save's weights, or an interrupted one); save the model again")
    return weights


def push_to_hub(model: nn.Module, repo_id: str, *, private: bool = False, token: Optional[str] = None,
                metrics: Optional[Dict[str, Any]] = None, config: Optional[Dict[str, Any]] = None,
                commit_message: str = "Upload encoding model") -> str:
    """:func:`save_pretrained` into a temporary folder and upload it to the Hub repository ``repo_id`` (created
    when missing). Before any work: the id's form, the model's info, and that the Hub answers as a logged-in user.

    Returns:
        The URL of the commit.

    Raises:
        UsageError: a malformed ``repo_id``, a model without info.
        HubUnavailable: offline, ``HF_HUB_OFFLINE=1``, not logged in, or the Hub refusing the upload (one line).
    """
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise MissingDependency("push_to_hub needs huggingface_hub: pip install encoding[hub]") from None
    if not isinstance(repo_id, str) or not is_hub_id(repo_id):
        raise UsageError(f"push_to_hub: repository id {str(repr(repo_id))[:80]} is not of the form user/name")
    model_info(model)
    api = HfApi(token=token)
    _on_hub(repo_id, "cannot reach the Hugging Face Hub as a logged-in user", api.whoami)
    _on_hub(repo_id, "cannot create the repository", api.create_repo, repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder, metrics=metrics, config=config)
        return str(_on_hub(repo_id, "the upload failed", api.upload_folder, repo_id=repo_id, folder_path=folder,
                           commit_message=commit_message))


class HubUnavailable(ConnectionError, EncodingError):
    """The Hugging Face Hub cannot be used now: offline, ``HF_HUB_OFFLINE=1``, not logged in, or a refused request
    (one line; exit status 2)."""

    exit_status = EXIT_USAGE


def _on_hub(repo: str, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` of ``huggingface_hub``; its errors (network, login, refusals) as one line."""
    try:
        return call(*args, **kwargs)
    except Exception as err:  # httpx / requests errors, HfHubHTTPError, OfflineModeIsEnabled, LocalTokenNotFound...
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise HubUnavailable(f"push_to_hub({repo!r}): {what} ({type(err).__name__}{': ' if reason else ''}"
                             f"{reason}); log in with `huggingface-cli login` (or pass token=) and check the network "
                             "(HF_HUB_OFFLINE unset)") from None


SOURCE_READERS.append((is_pretrained_source, load_pretrained))  # encoding.load_model(folder | "user/repo")
