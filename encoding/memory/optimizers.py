"""The optimizer a device program steps (:func:`~encoding.memory.program.run_program`): the one of its strategy
(:func:`build_optimizer`), the state a warm-up step leaves (:func:`optimizer_warmup`), and which programs on one model
may step one warmed optimizer instead of warming up their own (:func:`optimizer_key`, :func:`optimizer_state`: what
the simulator counts as held)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import Tensor, nn

from ..utils.optim import optimizer_settings
from .sharded import LocalShardOptimizer, PartitionOptimizer, zero_optimizer

__all__ = ["build_optimizer", "optimizer_warmup", "optimizer_key", "optimizer_state", "optimizer_factory",
           "training_optimizer"]


def build_optimizer(spec: Any, program: Any, params: List[Tensor], real_ddp: bool = False) -> Optional[Any]:
    """The optimizer of ``program`` (a :class:`~encoding.memory.program.DeviceProgram`) over ``params``, made with
    ``spec.optimizer``: a real ``zero1`` rank's ``ZeroRedundancyOptimizer`` (a simulated one's
    :class:`~encoding.memory.sharded.PartitionOptimizer`), a simulated ``fsdp`` rank's
    :class:`~encoding.memory.sharded.LocalShardOptimizer`, the module's own where the program keeps it, else
    ``None`` (a replica: its gradients leave for device 0)."""
    if program.strategy == "zero1":
        return zero_optimizer(params, spec.optimizer) if real_ddp else PartitionOptimizer(params, spec.optimizer)
    if program.strategy == "fsdp" and not real_ddp:  # simulated: the same tensors, DTensor's dispatch skipped
        return LocalShardOptimizer(params, spec.optimizer)
    return spec.optimizer(params) if program.keeps_module else None


def optimizer_warmup(params: List[Tensor], optimizer: Optional[Any]) -> None:
    """What a warm-up step leaves behind on fake tensors: the optimizer's state (e.g. momentum buffers). The
    simulator's own optimizers warm up the tensors they hold state for (:meth:`LocalShardOptimizer.warm_up
    <encoding.memory.sharded.LocalShardOptimizer.warm_up>`: the shards' local tensors, without a ``DTensor``
    gradient per parameter)."""
    if hasattr(optimizer, "warm_up"):
        optimizer.warm_up()
    elif optimizer is not None:
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def optimizer_key(program: Any) -> Optional[tuple]:
    """Which programs on one model step the same optimizer: every program that keeps the module but ``zero1``'s steps
    one over all parameters, an ``fsdp`` rank one over its own shards, a ``zero1`` rank one over its partition
    (``None``: no optimizer to share)."""
    if program.strategy == "zero1":
        return ("zero1", program.replicas, program.rank)
    if program.strategy == "fsdp":
        return ("fsdp", program.replicas, program.rank)
    return ("module",) if program.keeps_module else None


def optimizer_state(optimizer: Any) -> List[Dict[str, Any]]:
    """The per-parameter state of a shared ``optimizer`` (a torch optimizer or a
    :class:`~encoding.memory.sharded.LocalShardOptimizer`)."""
    return list(optimizer.state.values())


def optimizer_factory(kind: str = "sgd", momentum: float = 0.9, weight_decay: float = 1e-4,
                      foreach: Optional[bool] = True) -> Callable[[Any], torch.optim.Optimizer]:
    """``params -> optimizer``: training's ``--optimizer kind`` (:func:`~encoding.utils.optim.optimizer_settings`)
    for a simulated step; ``foreach`` is its multi-tensor form, torch's default on GPUs (``True``: the simulated
    devices are GPUs; ``None``: torch's default for the parameters' device).

    Raises:
        ValueError: an unknown ``kind``.
    """
    cls, hyper = optimizer_settings(kind, lr=0.01, momentum=momentum, weight_decay=weight_decay)

    def build(params: Any) -> torch.optim.Optimizer:
        return cls(params, foreach=foreach, **hyper)
    return build


def training_optimizer(model: nn.Module, groups: Sequence[Dict[str, Any]],
                       options: Optional[Dict[str, Any]] = None) -> Callable[[List[Tensor]], Any]:
    """``params -> optimizer`` for a simulated copy of ``model``: the training optimizer of
    :func:`encoding.engine.builders.build_optimizer`'s ``options`` that change what it holds (``kind``: ``"sgd"``
    or ``"adamw"``, ``momentum``, ``weight_decay``; default its defaults; torch's own ``foreach`` default for the
    parameters' device) over the parameter groups ``groups`` of ``model`` (``param_groups(model)``), matched by
    position among its trainable parameters.

    Raises:
        ValueError: an unknown option or ``kind``, or a group parameter that is not one of ``model``'s trainable ones.
    """
    known = {"kind": "sgd", "momentum": 0.9, "weight_decay": 1e-4}
    unknown = sorted(set(options or {}) - set(known))
    if unknown:
        raise ValueError(f"optimizer: unknown option(s) {', '.join(unknown)}; valid: {', '.join(known)}")
    make = optimizer_factory(**dict(known, **(options or {})), foreach=None)
    position = {id(p): i for i, p in enumerate(p for p in model.parameters() if p.requires_grad)}
    if any(id(p) not in position for group in groups for p in group["params"]):
        raise ValueError("training_optimizer: a parameter group holds a tensor that is no trainable parameter of "
                         "the model")
    indices = [[position[id(p)] for p in group["params"]] for group in groups if group["params"]]

    def build(params: List[Tensor]) -> Any:
        if len(params) != len(position):  # the copy is the model's: the same trainable parameters in order
            raise ValueError(f"training_optimizer: {len(params)} parameters, the model has {len(position)}")
        return make([{"params": [params[i] for i in group]} for group in indices])
    return build
