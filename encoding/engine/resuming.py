"""What a resumed checkpoint fixes (``train.py --resume``, and ``--eval`` of a checkpoint): refused before any work,
in one line naming the option, the checkpoint's value and what to pass (``docs/training.md``, "What a resume
honours"). The checkpoint is read once, by :func:`encoding.engine.assemble.run_training`."""
from __future__ import annotations

from typing import Any, Optional

from ..config import TrainingConfig
from ..models.registry import ARCHITECTURES
from ..names import is_model_spec
from ..utils.dist import launched_world_size
from . import state
from .data import ConfigError, draws_holdout

__all__ = ["MID_EPOCH_OPTIONS", "check_resume", "check_same_network"]


def _stride(model: str, value: Optional[int]) -> Optional[int]:
    """The output stride a network is built with: ``value``, else a registered architecture's own."""
    if value is not None or is_model_spec(model):
        return value
    return ARCHITECTURES[model].output_stride if model in ARCHITECTURES else None


def check_same_network(config: "TrainingConfig", checkpoint: state.Checkpoint) -> None:
    """Refuse a resume or an ``--eval`` of ``checkpoint`` that would build another network than it trained with an
    option that changes no weight's shape (``--output-stride``: the weights would load into another network without
    a word); options that change the weights fail as they load.

    Raises:
        ConfigError: naming both values and what to pass.
    """
    saved = checkpoint.data.get("args") or {}
    theirs, ours = (_stride(str(saved.get("model", config.model)), saved.get("output_stride")),
                    _stride(config.model, config.output_stride))
    if "output_stride" in saved and theirs != ours:
        given = f"--output-stride {config.output_stride}" if config.output_stride else \
            f"no --output-stride ({config.model}'s own {ours})"
        raise ConfigError(f"{given}: {checkpoint.path} was trained with --output-stride {theirs}, a network of the "
                          f"same weights: pass --output-stride {theirs}" + ("" if config.eval else
                                                                              ", or --ft to start a new run"))


#: The options that make an epoch's samples and their order: a mid-epoch checkpoint continues only with its own.
MID_EPOCH_OPTIONS = ("batch_size", "train_limit", "seed", "dataset", "data_root", "train_split")


def check_resume(config: "TrainingConfig", checkpoint: state.Checkpoint, *, given_datasets: bool = False) -> None:
    """Refuse the options a resume of ``checkpoint`` cannot honour (see ``docs/training.md``, "What a resume
    honours"): another optimizer; in the middle of an epoch another :data:`MID_EPOCH_OPTIONS` value, or ``epochs``
    that end before that epoch; a ``folder`` dataset's hold-out drawn with other ``val_fraction`` / ``seed``.

    Raises:
        ConfigError: naming the option, the checkpoint's value and what to do.
    """
    saved, path = checkpoint.data.get("args") or {}, checkpoint.path
    if saved.get("optimizer") not in (None, config.optimizer):
        raise ConfigError(f"--optimizer {config.optimizer}: {path} was trained with --optimizer "
                          f"{saved['optimizer']} and a resume continues its optimizer state; pass --optimizer "
                          f"{saved['optimizer']}, or --ft to start a new optimizer from its weights")
    checkpoint.check_world_size(launched_world_size())
    iteration, epoch = int(checkpoint.data.get("iteration", 0)), checkpoint.done
    if iteration and config.epochs <= epoch:
        raise ConfigError(f"--epochs {config.epochs}: {path} stopped after iteration {iteration} of epoch {epoch} "
                          f"(counted from 0), which --epochs {config.epochs} does not reach; resume it with --epochs "
                          f"{epoch + 1} or more, or --ft to start a new run from its weights")
    for name in MID_EPOCH_OPTIONS if iteration else ():
        if name in saved and saved[name] != getattr(config, name):
            given, theirs = (_option(name, value) for value in (getattr(config, name), saved[name]))
            raise ConfigError(f"{given}: {path} stopped after iteration {iteration} of epoch {epoch} with {theirs}; "
                              f"resume it with {theirs} (the epoch's remaining samples depend on it)")
    for name in ("val_fraction", "seed") if not given_datasets and draws_holdout(config) else ():
        if saved.get(name) is not None and saved[name] != getattr(config, name):
            option = "--" + name.replace("_", "-")
            raise ConfigError(f"{option} {getattr(config, name)}: {path} drew its hold-out of {config.data_root} "
                              f"with {option} {saved[name]}, and a resume validates on that hold-out; resume it with "
                              f"{option} {saved[name]}, or --ft to start a new run from its weights")


def _option(name: str, value: Any) -> str:
    """``--data-root /x``, or ``no --data-root`` for an option left unset."""
    option = "--" + name.replace("_", "-")
    return f"no {option}" if value is None else f"{option} {value}"
