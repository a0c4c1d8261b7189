"""The checkpoint state of sharded runs (``--strategy fsdp`` / ``zero1``): gathered into FULL, ordinary state dicts.

A run's checkpoint holds the same thing under every strategy: the model's ordinary state dict (plain tensors, the
bare model's keys) and the optimizer's ordinary ``state_dict()`` (state keyed by the position of each parameter in
the groups, as a single-process ``torch.optim`` optimizer writes it). So a checkpoint of an ``fsdp`` run evaluates
in a plain ``test.py`` and resumes under any strategy, and the other way round.

* FSDP2 (``fully_shard``): ``torch.distributed.checkpoint.state_dict`` gathers the full model and optimizer state
  onto rank 0's CPU (``full_state_dict=True, cpu_offload=True``); its optimizer state, keyed by parameter names, is
  keyed by position here (and back when loading).
* ZeRO-1 (``ZeroRedundancyOptimizer``): ``consolidate_state_dict(to=0)`` collects every rank's share on rank 0.

:func:`full_state` is a collective (every rank calls it, at the same point); :func:`load_optimizer_state` runs on
every rank with the whole checkpoint.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple, Union

import torch
from torch import nn

from ..utils.dist import is_fully_sharded, is_main_process

__all__ = ["full_state", "load_optimizer_state"]


def _is_zero(optimizer: torch.optim.Optimizer) -> bool:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def _state_dict_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _names(model: nn.Module, optimizer: torch.optim.Optimizer) -> List[str]:
    """The name of each parameter of ``optimizer``'s groups, in order (its positions in an ordinary state dict)."""
    names = {id(p): name for name, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def _by_position(state: Mapping[str, Any], names: List[str]) -> Dict[str, Any]:
    """A name-keyed optimizer state dict (``torch.distributed.checkpoint``'s) keyed by position, as ``torch.optim``
    writes it."""
    position = {name: i for i, name in enumerate(names)}
    groups = [{**group, "params": [position[name] for name in group["params"]]} for group in state["param_groups"]]
    return {"state": {position[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def _by_name(state: Mapping[str, Any], names: List[str]) -> Dict[str, Any]:
    """An ordinary (position-keyed) optimizer state dict keyed by parameter names."""
    groups = [{**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]]
    return {"state": {names[int(i)]: value for i, value in state["state"].items()}, "param_groups": groups}


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer
               ) -> Tuple[Union[nn.Module, Dict[str, Any]], Union[torch.optim.Optimizer, Dict[str, Any], None]]:
    """What the checkpoint stores of ``model`` and ``optimizer``, complete on the main process.

    A collective under ``fsdp`` and ``zero1``: call it on every rank. Unsharded runs get their arguments back
    (:func:`~encoding.utils.save_checkpoint` takes their ``state_dict()``, unwrapped).

    Returns:
        ``(model state, optimizer state)``: full, ordinary state dicts (or the objects themselves) on the main
        process; on the other ranks what is left (empty dicts or ``None``), not to be saved.
    """
    if is_fully_sharded(model):
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

        model_state = get_model_state_dict(model, options=_state_dict_options())
        optimizer_state = get_optimizer_state_dict(model, optimizer, options=_state_dict_options())
        names = _names(model, optimizer)
        return model_state, (_by_position(optimizer_state, names) if is_main_process() else {})
    if _is_zero(optimizer):
        optimizer.consolidate_state_dict(to=0)
        return model, (optimizer.state_dict() if is_main_process() else None)
    return model, optimizer


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]) -> None:
    """Load an ordinary optimizer state dict (any strategy's checkpoint) into ``optimizer`` of ``model``.

    Under ``fsdp`` every rank keeps the shards of its parameters, under ``zero1`` the state of its share.
    """
    if is_fully_sharded(model):
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, _by_name(state, _names(model, optimizer)),
                                 options=_state_dict_options())
    elif _is_zero(optimizer):  # it clears the entries of the other ranks' parameters: give it a copy
        optimizer.load_state_dict({**state, "state": dict(state["state"])})
    else:
        optimizer.load_state_dict(state)
