"""The data side of a training run: the dataset's own options, its metadata for the checkpoint, binary targets.

Everything downstream of training (``test.py``, ``demo.py``, :func:`encoding.load_model`, export, previews) takes
the classes, colours and ignore value from the checkpoint; :func:`data_metadata` is what the run records there.
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, Dict, List, Optional

from torch import nn
from torch.utils.data import Subset

from . import builders, state
from ..config import BUILTIN_SIZES, ConfigError  # noqa: F401 (their home: encoding.config)
from ..config.fields import cli_name
from ..datasets import DatasetError, datasets as DATASETS
from ..datasets.folder import HOLDOUT_NAME, find_splits, holdout_path
from ..datasets.metadata import BinaryTarget, binary_class_id, binary_setup, dataset_metadata
from ..datasets.scan import UNKNOWN_LABELS
from ..nn.binary import BINARY_LOSSES
from ..utils.determinism import SeededSamples
from ..utils.dist import is_main_process

__all__ = ["BUILTIN_SIZES", "ConfigError", "drop_bad_samples", "eval_dataset_options", "binary_targets",
           "check_classes", "check_split", "check_data_options", "BUILDING_OPTIONS", "check_given_data",
           "dataset_options", "draws_holdout", "write_holdout", "image_sizes", "data_metadata", "dataset_name",
           "run_criterion"]


def check_split(dataset: str, split: str, option: str, *, masks: bool = True) -> None:
    """Refuse a split the dataset does not have, or (``masks``) one without masks (``test``) where masks are needed.

    Raises:
        ConfigError: naming the option and the valid splits.
    """
    if getattr(DATASETS[dataset], "SPLITS_FROM_DATA", False):
        return  # a folder's splits are its lists / sub-folders: the dataset refuses another, naming them
    valid = getattr(DATASETS[dataset], "SPLITS", ())
    scored = [s for s in valid if s != "test"] if masks else list(valid)
    if split not in scored:
        why = "has no masks to train or validate on" if split in valid else "is not a split of " + dataset
        raise ConfigError(f"{option} {split}: {why}; valid: {', '.join(scored)}")


def check_data_options(c: Any) -> None:
    """Refuse the data options of a run it could only fail on later (one line, naming the option)."""
    if c.unknown_labels not in UNKNOWN_LABELS:
        raise ConfigError(f"--unknown-labels {c.unknown_labels}: choose one of {', '.join(UNKNOWN_LABELS)}")
    if not 0.0 < c.val_fraction < 1.0:
        raise ConfigError(f"--val-fraction {c.val_fraction}: must be between 0 and 1")
    if not 0.0 < c.threshold < 1.0:
        raise ConfigError(f"--threshold {c.threshold}: must be between 0 and 1")
    if (c.binary or c.binary_class) and c.loss not in BINARY_LOSSES:
        raise ConfigError(f"--loss {c.loss}: a binary run takes {', '.join(BINARY_LOSSES)}")
    if (c.binary or c.binary_class) and (c.se_loss or c.class_weights):
        raise ConfigError("--binary: one output channel, no --se-loss or --class-weights")


#: The options that build a run's datasets -> the attribute of a given ``(train, val)`` pair holding what it was
#: built with (``None``: none to compare with). With given datasets these are the caller's (:func:`check_given_data`).
BUILDING_OPTIONS = {"data_root": "root", "train_split": "split", "val_split": "split", "base_size": "base_size",
                    "crop_size": "crop_size", "skip_bad": "skip_bad", "scale_range": None, "val_fraction": None,
                    "unknown_labels": None}


def check_given_data(c: Any, datasets: Any) -> None:
    """Refuse an option that builds datasets, asked for on the command line (for a config built by hand: a value
    other than the default) with ``(train, val)`` datasets given, where the given ones were not built with it: it
    would change nothing (a saved ``config.yaml``, which records every value, still repeats its run).

    Raises:
        ConfigError: naming the option, its value and the given dataset's.
    """
    defaults = {f.name: f.default for f in dataclasses.fields(c)}
    for name, attribute in BUILDING_OPTIONS.items():
        value = getattr(c, name)
        if not (c.sources.get(name) == "command line" or (not c.sources and value != defaults[name])):
            continue
        data = _unwrapped(datasets[1] if name == "val_split" else datasets[0])
        own = getattr(data, attribute, None) if attribute else None
        if name == "data_root" and own is not None:
            value = os.path.abspath(os.path.expanduser(value))
        if own is None or own != value:
            has = f" (the given {type(data).__name__} has {own!r})" if own is not None else ""
            raise ConfigError(f"{cli_name(name)} {value}: the datasets given to the run are built already{has}; "
                              "build them with it, or leave the option out")


def drop_bad_samples(datasets: Any) -> int:
    """Read every sample of ``datasets`` once (``--verify-data``): the first bad file raises, or with ``--skip-bad``
    the bad samples are dropped (each dataset's ``verify``); returns how many were dropped in all.

    Raises:
        DatasetError: a bad file, without ``skip_bad`` (the message names it).
    """
    dropped = 0
    for dataset in datasets:
        bad = dataset.verify()
        if bad and is_main_process():
            print(f"verify: dropped {bad} bad sample(s) of {dataset.split!r} (--skip-bad)")
        dropped += bad
    return dropped


def dataset_options(config: Any, fresh: bool = False) -> Dict[str, Any]:
    """The keywords of ``config``'s dataset class beyond the common ones: the ``folder`` dataset's hold-out
    (``val_fraction``, seeded, listed in the run directory; ``fresh``: drawn anew, the list there is an earlier
    run's that ``--overwrite`` replaces) and ``unknown_labels``."""
    if config.dataset != "folder":
        return {}
    return {"val_fraction": config.val_fraction, "unknown_labels": config.unknown_labels, "binary": config.binary,
            "holdout_file": None if fresh else holdout_path(config.run_dir), "holdout_seed": config.seed}


def draws_holdout(config: Any) -> bool:
    """Whether the run's ``folder`` dataset holds its validation images out of its training images (the folder has
    no ``val`` split): ``--val-fraction`` and ``--seed`` drew that hold-out. ``False`` for a folder that cannot be
    read (the run reports it when it builds the dataset)."""
    if config.dataset != "folder" or not config.data_root:
        return False
    try:
        return "val" not in find_splits(os.path.abspath(os.path.expanduser(config.data_root)))[1]
    except (DatasetError, OSError):
        return False


def write_holdout(config: Any, train_data: Any) -> None:
    """Write a folder dataset's hold-out list to the run directory (main process; none for ``--eval``, none when the
    folder has its own ``val`` split, and an existing list is kept)."""
    if hasattr(train_data, "save_holdout") and not config.eval and is_main_process():
        train_data.save_holdout(holdout_path(config.run_dir))


def image_sizes(config: Any) -> Dict[str, Any]:
    """``base_size``, ``crop_size`` and ``scale_range`` of a run: the configured ones; where ``None``, the built-in
    run's for ``shapes`` and the dataset's own for any other dataset (left ``None``)."""
    return {k: getattr(config, k) if getattr(config, k) is not None or config.dataset != "shapes" else v
            for k, v in BUILTIN_SIZES.items()}


def run_criterion(c: Any, nclass: int, binary: bool, device: Any, train_dataset: Any) -> nn.Module:
    """The run's criterion: a binary loss of :data:`~encoding.nn.BINARY_LOSSES` (one channel), else
    :func:`~encoding.engine.builders.build_criterion`'s."""
    if binary:
        return BINARY_LOSSES[c.loss](aux=c.aux, aux_weight=c.aux_weight, ignore_index=-1).to(device)
    return builders.build_criterion(nclass, aux=c.aux, aux_weight=c.aux_weight, se_loss=c.se_loss,
                                    se_weight=c.se_weight, device=device, loss=c.loss,
                                    class_weights=c.class_weights, train_dataset=train_dataset)


def data_metadata(c: Any, train_data: Any, val_data: Any, binary: bool, holdout: bool = True) -> Dict[str, Any]:
    """The dataset's classes and colours for the checkpoint (binary: two classes, the targets mapped); a folder
    dataset's scan summary is printed and (``holdout``) its hold-out list written to the run directory
    (:func:`write_holdout`)."""
    if binary:
        try:
            transform, _ = binary_setup(train_data, c.binary_class)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if transform is not None:
            train_data.target_transform = val_data.target_transform = transform
    meta = dataset_metadata(train_data, c.binary_class)
    if not binary and len(meta["classes"]) < 2:
        raise ConfigError(f"--dataset {c.dataset}: {len(meta['classes'])} class ({', '.join(meta['classes'])}): "
                          "nothing to tell apart (every pixel would score 100 %); a class against the rest is "
                          "--binary with two classes")
    scan = getattr(train_data, "scan", None)
    if scan is not None and is_main_process():
        print(scan.summary())
        if holdout:
            write_holdout(c, train_data)
    return meta


def eval_dataset_options(dataset: str, checkpoint: Optional[str], info: Any) -> Dict[str, Any]:
    """The dataset keywords of an evaluation of ``checkpoint``: a ``folder`` dataset validates on the hold-out
    its run listed next to the checkpoint, else on the hold-out drawn again with the run's recorded seed and share
    (the same images while the folder holds the same files), with the run's ``unknown_labels``. A checkpoint that
    recorded neither (not ``train.py``'s) draws with the defaults, and a warning says the hold-out may hold training
    images."""
    if dataset != "folder":
        return {}
    options = {"unknown_labels": info.options.get("unknown_labels") or "error",
               "binary": bool(info.options.get("binary"))}
    holdout = holdout_path(os.path.dirname(os.path.abspath(checkpoint))) if checkpoint else None
    if holdout and os.path.isfile(holdout):
        return {**options, "holdout_file": holdout}
    saved = state.saved_options(checkpoint, ("seed", "val_fraction")) if checkpoint else {}
    if saved.get("seed") is not None and saved.get("val_fraction") is not None:
        return {**options, "holdout_seed": saved["seed"], "val_fraction": saved["val_fraction"]}
    warnings.warn(f"{checkpoint or 'these weights'}: no hold-out list ({HOLDOUT_NAME}) beside it and no recorded seed "
                  "and --val-fraction: a folder without a val split is held out with the defaults, which may hold "
                  "images the network trained on", stacklevel=2)
    return options


def binary_targets(dataset: Any, info: Any) -> None:
    """Give the evaluated dataset the foreground / background targets of a ``--binary-class`` network."""
    name = info.options.get("binary_class")
    if name:
        data = _unwrapped(dataset)
        data.target_transform = BinaryTarget(binary_class_id(list(data.CLASSES), name))


def check_classes(dataset: Any, info: Any) -> None:
    """Refuse data whose classes are not the network's, in the same order: a class id of the masks would be scored
    as another class (a folder's class file reordered or renamed, another dataset). A ``--binary-class`` network
    needs only its class among the data's (:func:`binary_targets`)."""
    data = _unwrapped(dataset)
    names, theirs = list(getattr(data, "CLASSES", None) or ()), list(info.classes or ())
    if info.options.get("binary_class") or not names or not theirs or names == theirs:
        return
    scan = getattr(data, "scan", None)
    source = getattr(getattr(scan, "spec", None), "source", "") or getattr(data, "root", "") or dataset_name(data)
    differ = next(i for i in range(max(len(names), len(theirs))) if _name(names, i) != _name(theirs, i))
    raise DatasetError(str(source), f"the data's {len(names)} classes are not the network's {len(theirs)} (class "
                                    f"{differ}: {_name(names, differ)} here, {_name(theirs, differ)} in the network): "
                                    "its masks would be scored as other classes; evaluate on data labelled with the "
                                    "network's classes, in its order")


def _name(names: List[str], i: int) -> str:
    return repr(names[i]) if i < len(names) else "none"


def _unwrapped(dataset: Any) -> Any:
    while isinstance(dataset, (Subset, SeededSamples)):
        dataset = dataset.dataset
    return dataset


def dataset_name(dataset: Any) -> str:
    """The registry name of a dataset object's class, else its ``NAME``, else its class name in lower case."""
    cls = type(_unwrapped(dataset))
    for name, registered in DATASETS.items():
        if registered is cls:
            return name
    return getattr(cls, "NAME", "") or cls.__name__.lower()
