"""The flat view of a training run's settings: :class:`TrainingConfig`, one keyword per ``train.py`` option.

Its fields are made from the option fields of :mod:`.groups` (those of ``train.py``, in their order, with their
defaults: the built-in run), plus ``sources`` (where each non-default value came from, as
:func:`~.resolve.resolve` found it). ``TrainingConfig(epochs=2, lr=0.01)`` is the built-in run with two changes;
``Settings.training()`` is the resolved one.
"""
from __future__ import annotations

import warnings
from dataclasses import field, make_dataclass
from typing import Any, Dict, Mapping, Optional

from ..utils.rundir import run_directory
from .parser import option_specs

__all__ = ["TrainingConfig", "OLD_KEYWORDS"]

#: Old keywords of :class:`TrainingConfig` still accepted (with a ``FutureWarning``) -> their new names.
OLD_KEYWORDS = {"checkpoint": "recompute"}


def _run_dir(self: Any) -> str:
    """Where the run writes (:func:`~encoding.utils.rundir.run_directory`)."""
    return run_directory(self.output_dir, self.dataset, self.model, self.checkname)


TrainingConfig = make_dataclass(
    "TrainingConfig",
    [(f.name, f.type, field(default=f.default, metadata=f.metadata)) for f, _ in option_specs("train")]
    + [("sources", Mapping[str, str], field(default_factory=dict, compare=False, repr=False)),
       ("config_file", Optional[str], field(default=None, compare=False, repr=False))],
    namespace={"run_dir": property(_run_dir), "__module__": __name__, "__doc__": (
        "A training run's options (``train.py``'s, one keyword each; see ``docs/configs.md``).\n\n"
        "The defaults are the built-in run, what ``train.py`` runs without options: a U-Net on ``vgg_tiny`` learning "
        "the embedded ``shapes`` dataset on a CPU in minutes (the option fields of :mod:`encoding.config.groups` "
        "hold them). ``sources`` maps an option to where its value came from (``resolve``'s record; empty when "
        "built by hand); ``config_file`` is the ``--config`` file read (``None``: none). ``checkpoint=`` is the "
        "old name of ``recompute=`` (``FutureWarning``).")})
_generated_init = TrainingConfig.__init__


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    for old, new in OLD_KEYWORDS.items():
        if old in kwargs:
            warnings.warn(f"TrainingConfig({old}=...) is now TrainingConfig({new}=...)", FutureWarning, stacklevel=2)
            kwargs.setdefault(new, kwargs.pop(old))
    _generated_init(self, *args, **kwargs)


TrainingConfig.__init__ = _init


def flat_options(config: Any) -> Dict[str, Any]:
    """The options of a :class:`TrainingConfig` by name (``sources`` and ``config_file`` left out)."""
    return {f.name: getattr(config, f.name) for f, _ in option_specs("train")}
