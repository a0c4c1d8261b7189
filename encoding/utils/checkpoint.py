"""Crash-safe training checkpoints that load with ``weights_only=True``.

A checkpoint is a dict with the keys ``model``, ``optimizer``, ``scheduler``, ``scaler`` (state dicts), ``epoch``,
``best_pred``, ``args`` (a plain dict), ``metrics`` and the marker ``format="encoding.checkpoint"``/``version``,
which is how :func:`load_checkpoint` tells our files apart from anything else. Everything stored is made of tensors,
numbers, strings and plain containers, so loading never needs to unpickle arbitrary objects: a file that would
execute code on load is refused.

:func:`save_checkpoint` serialises once, writes to a temporary file in the target directory, flushes and fsyncs it,
then ``os.replace``-s it over the destination: a crash leaves either the old or the new checkpoint, never a partial
one. Models wrapped in ``DataParallelModel``, ``nn.DataParallel`` or ``DistributedDataParallel`` are unwrapped, so
the saved keys have no ``module.`` prefix and load into the bare model.

This module is also the one place that reads weights: :func:`read_state_dict` (any state-dict file a user hands us,
``weights_only=True``) and :func:`load_model_state` (checked loading: every mismatch reported, nothing loaded on a
mismatch) serve the backbones, the model zoo and resuming alike.
"""
from __future__ import annotations

import argparse
import io
import os
import pickle
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Union

import numpy as np
import torch
from torch import Tensor, nn

from ..errors import EncodingError
from .dist import is_fully_sharded
from .files import atomic_write
from .torch_files import global_naming_nothing, torch_file_problem

__all__ = ["CheckpointError", "NonFiniteError", "first_nonfinite", "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION",
           "CHECKPOINT_NAME", "BEST_NAME", "unwrap_model", "save_checkpoint", "load_checkpoint", "load_model_state",
           "check_state_fits", "read_state_dict"]

CHECKPOINT_FORMAT = "encoding.checkpoint"
CHECKPOINT_VERSION = 1
CHECKPOINT_NAME, BEST_NAME = "checkpoint.pth", "model_best.pth"
_STATEFUL_KEYS, PathLike = ("optimizer", "scheduler", "scaler"), Union[str, os.PathLike]


class CheckpointError(RuntimeError, ValueError, EncodingError):
    """A checkpoint or weights file could not be used: corrupt, unsafe, foreign, or not matching the model (also a
    ``ValueError``: bad weights are a bad argument value, ``pretrained="file.pth"``)."""


class NonFiniteError(FloatingPointError, EncodingError):
    """The state to save holds NaN or infinite values (the training diverged); nothing was written.

    Attributes:
        tensor: the first offending tensor and its count of bad values (``"model.bn1.running_var (3 of 64 ...)"``).
    """

    def __init__(self, message: str, tensor: str) -> None:
        super().__init__(message)
        self.tensor = tensor


def _tensors(value: Any, prefix: str) -> Iterable[tuple]:
    """``(name, tensor)`` for every tensor inside nested dicts/lists (state dicts, optimizer states)."""
    if isinstance(value, Tensor):
        yield prefix, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _tensors(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        yield from (pair for i, item in enumerate(value) for pair in _tensors(item, f"{prefix}[{i}]"))


def first_nonfinite(state: Any, prefix: str = "") -> Optional[str]:
    """Name (and count of bad values) of the first floating tensor in ``state`` holding NaN or inf; ``None`` if
    every tensor is finite. ``state`` is a module, a state dict or any nesting of dicts/lists of tensors."""
    if isinstance(state, nn.Module):
        state = unwrap_model(state).state_dict()
    for name, tensor in _tensors(state, prefix):
        if tensor.is_floating_point() or tensor.is_complex():
            bad = ~torch.isfinite(tensor.detach())
            if bool(bad.any()):
                return f"{name} ({int(bad.sum())} of {tensor.numel()} values NaN/inf)"
    return None


def unwrap_model(model: nn.Module) -> nn.Module:
    """The innermost module of ``DataParallelModel`` / ``nn.DataParallel`` / ``DistributedDataParallel`` wrappers
    (anything whose ``.module`` is an ``nn.Module``); other modules are returned unchanged."""
    while isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def _plain(value: Any) -> Any:
    """Convert a value into what ``torch.load(weights_only=True)`` accepts (tensors, numbers, str, containers)."""
    if isinstance(value, np.generic):  # before the float check: np.float64 subclasses float
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str, Tensor)):
        return value
    if isinstance(value, argparse.Namespace):
        return _plain(vars(value))
    if isinstance(value, Mapping):
        return {str(k) if not isinstance(k, (int, str)) else k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return (tuple if isinstance(value, tuple) else list)(_plain(v) for v in value)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (os.PathLike, torch.device, torch.dtype)):
        return str(value)
    raise TypeError(f"cannot store a {type(value).__name__} in a checkpoint (only tensors, numbers, strings, "
                    "argparse.Namespace and plain containers are kept so the file loads with weights_only=True)")


def _state_of(value: Any) -> Any:
    """``state_dict()`` of an object that has one (models unwrapped first), else the value itself."""
    if isinstance(value, nn.Module):
        return unwrap_model(value).state_dict()
    state_dict = getattr(value, "state_dict", None)
    return state_dict() if callable(state_dict) else value


def _build(state: Mapping[str, Any]) -> Dict[str, Any]:
    if not isinstance(state, Mapping):
        raise TypeError(f"state must be a dict, got {type(state).__name__}")
    if "model" not in state and "state_dict" in state:  # PyTorch-Encoding's key, kept: its code reads it back
        state = {"model": state["state_dict"], **state}
    if "model" not in state:
        raise KeyError("state must contain 'model' (a module or its state_dict)")
    checkpoint: Dict[str, Any] = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION}
    for key, value in state.items():
        if key in ("format", "version"):
            continue
        if key == "model" or key in _STATEFUL_KEYS:
            value = _state_of(value)
        if key == "model" and isinstance(value, Mapping) and all(isinstance(v, Tensor) for v in value.values()):
            checkpoint[key] = value  # kept as is: its ``_metadata`` (module versions) survives weights_only loading
            continue
        try:
            checkpoint[key] = _plain(value)
        except TypeError as err:
            raise TypeError(f"checkpoint entry {key!r}: {err}") from None
    return checkpoint


def _pe_destination(args: argparse.Namespace, filename: str) -> tuple:
    """PE's ``runs/<dataset>/<model>[/<backbone>]/<checkname>``, checkpoint and best file names (``*.pth.tar``)."""
    parts = [args.dataset, args.model] + ([args.backbone] if hasattr(args, "backbone") else []) + [args.checkname]
    name = "checkpoint.pth.tar" if filename == CHECKPOINT_NAME else filename
    return os.path.join("runs", *map(str, parts)), name, "model_best.pth.tar"


def _destination(path_or_dir: PathLike, filename: str) -> str:
    """A path with a suffix (``run/last.pth``) is the file; a directory (existing or suffix-less) gets ``filename``."""
    path = os.fspath(path_or_dir)
    if os.path.isdir(path) or not Path(path).suffix:
        return os.path.join(path, filename)
    return path


def save_checkpoint(state: Mapping[str, Any], path_or_dir: PathLike, is_best: bool = False,
                    filename: str = CHECKPOINT_NAME) -> str:
    """Write a checkpoint atomically, and also as ``model_best.pth`` when ``is_best``.

    Args:
        state: ``{"model": model_or_state_dict, "optimizer": ..., "scheduler": ..., "scaler": ..., "epoch": int,
            "best_pred": float, "args": Namespace_or_dict, "metrics": dict}``. Only ``model`` (or PE's
            ``state_dict``, then kept too) is required. Objects
            with ``state_dict()`` are stored as their state dict (wrapped models unwrapped); ``args`` may be an
            ``argparse.Namespace`` (stored as a dict); numpy values become tensors/numbers.
        path_or_dir: a directory (created if missing; the file is ``filename`` inside it) or a file path with a
            suffix such as ``runs/exp/epoch_10.pth``; PyTorch-Encoding's ``args`` (a ``Namespace``): its
            ``runs/<dataset>/<model>[/<backbone>]/<checkname>/checkpoint.pth.tar`` (and ``model_best.pth.tar``).
        is_best: also write ``model_best.pth`` next to it. It is written first, so an interruption between the two
            writes never leaves a checkpoint whose ``best_pred`` has no matching best file (see
            :func:`encoding.engine.state.restore_best` for the other direction).
        filename: file name used when ``path_or_dir`` is a directory.

    Returns:
        The path written.

    Raises:
        NonFiniteError: the model or optimizer state holds NaN/inf; nothing is written, so the last good checkpoint
            stays in place.

    Note:
        Under ``torch.distributed`` call it on the main process only (:func:`encoding.utils.is_main_process`).

    Example:
        >>> save_checkpoint({"model": model, "optimizer": optimizer, "epoch": epoch, "best_pred": best,
        ...                  "args": args}, "runs/shapes/fcn", is_best=new_pred > best)  # doctest: +SKIP
    """
    best = BEST_NAME
    if isinstance(path_or_dir, argparse.Namespace):  # PyTorch-Encoding's save_checkpoint(state, args, is_best)
        path_or_dir, filename, best = _pe_destination(path_or_dir, filename)
    target = _destination(path_or_dir, filename)
    checkpoint = _build(state)
    for key in ("model", "optimizer"):
        bad = first_nonfinite(checkpoint.get(key), key)
        if bad is not None:
            raise NonFiniteError(f"not saving {target}: {bad}", bad)
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    data = buffer.getvalue()
    if is_best:
        atomic_write(os.path.join(os.path.dirname(target) or ".", best), data)
    atomic_write(target, data)
    return target


def _summarise(keys: Iterable[str], limit: int = 10) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")


def _strip_prefix(state: Mapping[str, Tensor], expected: Iterable[str]) -> Mapping[str, Tensor]:
    """Drop a ``module.`` prefix left by saving a wrapped model (e.g. PyTorch-Encoding checkpoints)."""
    expected = set(expected)
    if not state or not all(k.startswith("module.") for k in state) or any(k.startswith("module.") for k in expected):
        return state
    stripped = OrderedDict((k[len("module."):], v) for k, v in state.items())
    metadata = getattr(state, "_metadata", None)
    if metadata is not None:  # module versions, keyed by module path ("module" itself becomes the root "")
        stripped._metadata = OrderedDict(  # type: ignore[attr-defined]
            (k[len("module."):] if k.startswith("module.") else ("" if k == "module" else k), v)
            for k, v in metadata.items())
    return stripped


def check_state_fits(model: nn.Module, state: Mapping[str, Tensor], strict: bool = True,
                     source: str = "checkpoint") -> List[str]:
    """Refuse ``state`` unless its keys and tensor shapes are ``model``'s (nothing is loaded; ``model`` may live on
    the ``meta`` device, so options are checked against stored shapes before any memory is spent on them).
    Returns the keys that would not be loaded (missing + unexpected; only possible with ``strict=False``).

    Raises:
        CheckpointError: listing missing keys, unexpected keys and shape mismatches.
    """
    model = unwrap_model(model)
    own = model.state_dict()
    state = _strip_prefix(state, own)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and isinstance(state[k], Tensor) and state[k].shape != own[k].shape]
    problems = []
    if shapes:
        problems.append(f"shape mismatch for {len(shapes)} key(s): {'; '.join(shapes[:10])}")
    if strict and missing:
        problems.append(f"missing keys ({len(missing)}): {_summarise(missing)}")
    if strict and unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {_summarise(unexpected)}")
    if problems:
        raise CheckpointError(f"{source} does not match {type(model).__name__}: " + "; ".join(problems)
                              + ("" if shapes or not strict else " (pass strict=False to load the matching keys)"))
    return missing + unexpected


def load_model_state(model: nn.Module, state: Mapping[str, Tensor], strict: bool = True,
                     source: str = "checkpoint") -> List[str]:
    """Load a state dict into ``model`` (unwrapped first), reporting every mismatch at once.

    Args:
        model: the module (wrappers such as ``DataParallelModel`` are unwrapped).
        state: the state dict (a ``module.`` prefix on every key is removed).
        strict: raise on missing/unexpected keys. Shape mismatches always raise.
        source: how to name the state in messages (e.g. the file path).

    Returns:
        The keys that were not loaded (missing + unexpected) when ``strict=False``; ``[]`` otherwise.

    Raises:
        CheckpointError: listing missing keys, unexpected keys and shape mismatches.
    """
    model = unwrap_model(model)
    state = _strip_prefix(state, model.state_dict())
    skipped = check_state_fits(model, state, strict, source)
    if is_fully_sharded(model):  # FSDP2: every rank keeps its shard of the full tensors
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(model, dict(state), options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        model.load_state_dict(state, strict=False)
    return [] if strict else skipped


def _read(path: str, map_location: Any) -> Any:
    """``torch.load(path, weights_only=True)``, with our errors for unsafe, truncated, corrupt or foreign files."""
    if os.path.isfile(path) and (problem := torch_file_problem(path)) is not None:  # before torch.load allocates
        raise CheckpointError(f"{path!r} {problem}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as err:
        if (nothing := global_naming_nothing(str(err))) is not None:  # a cut GLOBAL line, not an object to refuse
            raise CheckpointError(f"cannot read checkpoint {path!r}: the file is truncated or corrupt (it names "
                                  f"{nothing!r}, which is nothing)") from None
        raise CheckpointError(f"refused to load {path!r}: it holds Python objects other than tensors, numbers, "
                              "strings and plain containers, and unpickling those could run arbitrary code. Use "
                              "weights saved as a plain state dict.") from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, struct.error) as err:
        raise CheckpointError(f"cannot read checkpoint {path!r}: the file is truncated or corrupt "
                              f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None


def _is_state_dict(data: Any) -> bool:
    return isinstance(data, Mapping) and all(isinstance(v, Tensor) for v in data.values())


def read_state_dict(path: PathLike) -> Mapping[str, Tensor]:
    """Read the model weights of a file a user hands us, safely (``weights_only=True``, on the CPU).

    Accepts a plain state dict, one of our checkpoints (``"model"``), or a checkpoint holding it under
    ``"state_dict"`` (PyTorch-Encoding, many others). A ``module.`` prefix is removed by :func:`load_model_state`.

    Raises:
        FileNotFoundError: the file does not exist.
        CheckpointError: unsafe (a compressed or oversized zip record too), truncated or corrupt, or no state dict
            inside.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights file not found: {path!r}")
    state = _read(path, "cpu")
    for key in ("state_dict", "model"):
        if isinstance(state, Mapping) and isinstance(state.get(key), Mapping):
            state = state[key]
    if not _is_state_dict(state):
        raise CheckpointError(f"{path!r} does not contain a state dict (a mapping of names to tensors)")
    return state


def _foreign(data: Any, path: str) -> Dict[str, Any]:
    """Interpret a plain state dict or a PyTorch-Encoding checkpoint (``{"state_dict", "epoch", ...}``)."""
    if data and _is_state_dict(data):
        return {"model": dict(data)}
    if isinstance(data, Mapping) and isinstance(data.get("state_dict"), Mapping):
        converted = {"model": dict(data["state_dict"])}
        for key in ("epoch", "best_pred", "optimizer"):
            if key in data:
                converted[key] = data[key]
        return converted
    raise CheckpointError(f"{path!r} is neither an encoding checkpoint, a state dict nor a PyTorch-Encoding "
                          "checkpoint")


def load_checkpoint(path: PathLike, map_location: Any = None, model: Optional[nn.Module] = None,
                    optimizer: Any = None, scheduler: Any = None, scaler: Any = None, strict: bool = True,
                    allow_foreign: bool = False) -> Dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (safely: ``weights_only=True``).

    Args:
        path: the checkpoint file.
        map_location: as for ``torch.load`` (e.g. ``"cpu"``).
        model: if given, its weights are restored (unwrapped first; see :func:`load_model_state`).
        optimizer, scheduler, scaler: if given, restored with ``load_state_dict`` from the matching entry.
        strict: require the model keys to match exactly.
        allow_foreign: also accept a bare ``state_dict`` or a PyTorch-Encoding checkpoint (``{"state_dict": ...}``),
            returned in our schema.

    Returns:
        The checkpoint dict (``model``, ``epoch``, ``best_pred``, ``args``, ...).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: the file is truncated/corrupt, holds objects that would need arbitrary unpickling, is not an
            encoding checkpoint (unless ``allow_foreign``), lacks a requested entry, or does not match ``model``.

    Example:
        >>> ckpt = load_checkpoint("runs/shapes/fcn/checkpoint.pth", "cpu", model=model,
        ...                        optimizer=optimizer)  # doctest: +SKIP
        >>> start_epoch = ckpt["epoch"] + 1  # doctest: +SKIP
    """
    path = os.fspath(path)
    data = _read(path, map_location)
    if isinstance(data, Mapping) and data.get("format") == CHECKPOINT_FORMAT:
        if not isinstance(data.get("version"), int) or data["version"] > CHECKPOINT_VERSION:
            raise CheckpointError(f"{path!r} has checkpoint version {data.get('version')!r}; this encoding reads "
                                  f"versions <= {CHECKPOINT_VERSION}")
        checkpoint = dict(data)
    elif allow_foreign:
        checkpoint = _foreign(data, path)
    else:
        keys = _summarise(map(str, data)) if isinstance(data, Mapping) else type(data).__name__
        raise CheckpointError(f"{path!r} is not an encoding checkpoint (no format marker; content: {keys}). "
                              "Pass allow_foreign=True to load a plain state_dict or a PyTorch-Encoding checkpoint.")
    if model is not None:
        load_model_state(model, checkpoint["model"], strict=strict, source=repr(path))
    for key, obj in zip(_STATEFUL_KEYS, (optimizer, scheduler, scaler)):
        if obj is None:
            continue
        if checkpoint.get(key) is None:
            raise CheckpointError(f"{path!r} has no {key!r} state to restore")
        obj.load_state_dict(checkpoint[key])
    return checkpoint
