"""Replicate a module onto several devices, with replication callbacks (``__data_parallel_replicate__``)."""
from __future__ import annotations

import copy
import functools
from typing import Dict, List, Sequence

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from .comm import broadcast
from .devices import DeviceLike, resolve_devices

__all__ = ["CallbackContext", "replicate", "check_replicable", "execute_replication_callbacks",
           "patch_replication_callback"]


_CALLBACKS_DONE = "_replication_callbacks_done"


class CallbackContext:
    """An attribute bag shared by the copies of one submodule during replication.

    Every copy's ``__data_parallel_replicate__(ctx, copy_id)`` receives the same instance, so the master copy
    (``copy_id == 0``, called first) can leave things there for the others (e.g. a queue to synchronise on).
    """

    def __repr__(self) -> str:
        return f"CallbackContext({vars(self)})"


def execute_replication_callbacks(replicas: Sequence[nn.Module]) -> None:
    """Call ``__data_parallel_replicate__(ctx, copy_id)`` on every copy of every submodule that defines it.

    Copies are visited replica by replica, so the master copy (``copy_id == 0``) of each submodule is called before
    the others; the copies of one submodule share one :class:`CallbackContext`. A second call on the same replicas
    does nothing (e.g. a :class:`~encoding.parallel.DataParallelModel` patched by :func:`patch_replication_callback`).

    Args:
        replicas: the replicas of one module, in device order (replica 0 is the master copy).
    """
    if not replicas or replicas[0].__dict__.get(_CALLBACKS_DONE):
        return
    replicas[0].__dict__[_CALLBACKS_DONE] = True
    contexts: Dict[int, CallbackContext] = {}
    for copy_id, replica in enumerate(replicas):
        for position, module in enumerate(replica.modules()):
            if hasattr(type(module), "__data_parallel_replicate__"):  # class lookup: cheap for the common miss
                module.__data_parallel_replicate__(contexts.setdefault(position, CallbackContext()), copy_id)


def _tensor_copies(tensors: List[torch.Tensor], devices: List[torch.device], detach: bool):
    """Per-device copies of parameters or buffers; tensors that need no grad are always broadcast detached."""
    grad = [t for t in tensors if t.requires_grad and not detach]
    plain = [t for t in tensors if not (t.requires_grad and not detach)]
    copies: Dict[int, List[torch.Tensor]] = {}
    for group, group_detach in ((grad, False), (plain, True)):
        for j, replica_copies in enumerate(broadcast(group, devices, detach=group_detach)):
            copies.setdefault(j, [])
            for t, c in zip(group, replica_copies):
                copies[j].append((id(t), c))
    return [dict(copies.get(j, [])) for j in range(len(devices))]


def replicate(network: nn.Module, devices: Sequence[DeviceLike], detach: bool = None,
              callbacks: bool = True) -> List[nn.Module]:
    """Copies of ``network`` for each device, sharing the original parameters through autograd.

    Replicas hold their parameters as plain (non-leaf) tensors, so ``replica.parameters()`` is empty and gradients
    flow back into the original module's parameters. Replica 0, when it lives on the source device, shares the
    original buffers (its BatchNorm running-stat updates persist); the other replicas get their own copies.

    Args:
        network: the module, with all parameters and buffers on ``devices[0]``.
        devices: one device per replica (may repeat, e.g. ``["cpu"] * 3``).
        detach: copy without autograd (default: when grad mode is off).
        callbacks: call ``__data_parallel_replicate__`` on the copies (see :func:`execute_replication_callbacks`).

    Returns:
        The list of replicas.
    """
    check_replicable(network)
    devices = resolve_devices(devices)
    if detach is None:
        detach = not torch.is_grad_enabled()
    modules = list(network.modules())
    params = list(network.parameters())
    buffers = list(network.buffers())
    param_copies = _tensor_copies(params, devices, detach)
    buffer_copies = _tensor_copies(buffers, devices, detach)
    index = {id(m): i for i, m in enumerate(modules)}
    copies = [[_shallow_copy(m) for m in modules] for _ in devices]
    for i, module in enumerate(modules):
        for j in range(len(devices)):
            _fill_replica(module, copies[j][i], copies[j], index, param_copies[j], buffer_copies[j])
    replicas = [c[0] for c in copies]
    if callbacks:
        execute_replication_callbacks(replicas)
    return replicas


def check_replicable(network: nn.Module) -> None:
    """Refuse, before anything is broadcast, a module that still has uninitialized (lazy) parameters.

    Raises:
        RuntimeError: naming the first such submodule (torch's message: run a dummy forward pass first).
    """
    for name, module in network.named_modules():
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
            raise RuntimeError(f"Modules with uninitialized parameters can't be used with DataParallel: "
                               f"{name or type(network).__name__} ({type(module).__name__}) is not initialized yet. "
                               "Run a dummy forward pass (e.g. on one device) to initialize it first")


_MODULE_REPLICATE = nn.Module._replicate_for_data_parallel
_MODULE_SETATTR = nn.Module.__setattr__


def _shallow_copy(module: nn.Module) -> nn.Module:
    """``Module._replicate_for_data_parallel`` without the per-attribute ``__setattr__`` cost (replication of a
    ResNet-101 is dominated by Python overhead); classes that override it (e.g. RNNs) keep their own version."""
    if type(module)._replicate_for_data_parallel is not _MODULE_REPLICATE:
        replica = module._replicate_for_data_parallel()
        _own_containers(replica.__dict__)
        replica.__dict__["_former_parameters"] = {}
        return replica
    replica = object.__new__(type(module))
    state = module.__dict__.copy()
    _own_containers(state)
    state.update(_parameters={}, _is_replica=True, _former_parameters={})
    object.__setattr__(replica, "__dict__", state)
    return replica


_CONTAINERS = (dict, list, set)


def _own_containers(state: Dict[str, object]) -> None:
    """Give a replica its own shallow copy of every dict, list and set attribute (hook dictionaries included).

    ``Module._replicate_for_data_parallel`` shares them with the original: a model that registers hooks on its first
    call (transformers' output-capturing hooks) would then add one set per replica thread to the *original* module,
    which breaks it. With copies, whatever a replica registers or appends stays on the replica.
    """
    for key, value in state.items():
        if isinstance(value, _CONTAINERS):
            state[key] = copy.copy(value)


def _fill_replica(module: nn.Module, replica: nn.Module, replica_modules: List[nn.Module], index: Dict[int, int],
                  params: Dict[int, torch.Tensor], buffers: Dict[int, torch.Tensor]) -> None:
    """Point ``replica``'s children, parameters and buffers at the replica copies, as torch's ``replicate`` does.

    Entries are written straight into ``__dict__`` unless the class overrides ``__setattr__`` (e.g. RNNs, whose
    flat-weight cache must follow their parameters): then through ``setattr``, like torch.
    """
    state = replica.__dict__
    slow = type(replica).__setattr__ is not _MODULE_SETATTR
    for key, child in module._modules.items():
        _put(replica, "_modules", key, None if child is None else replica_modules[index[id(child)]], slow)
    for key, param in module._parameters.items():
        if param is None:
            state["_parameters"][key] = None
            continue
        copy = state["_former_parameters"][key] = params[id(param)]
        if slow:
            setattr(replica, key, copy)
        else:  # a plain attribute: replicas hold non-leaf tensors, and replica.parameters() is empty
            state[key] = copy
    for key, buf in module._buffers.items():
        _put(replica, "_buffers", key, None if buf is None else buffers[id(buf)], slow)


def _put(replica: nn.Module, slot: str, key: str, value: object, slow: bool) -> None:
    if slow and value is not None:
        setattr(replica, key, value)
    else:
        replica.__dict__[slot][key] = value


def patch_replication_callback(data_parallel: nn.DataParallel) -> nn.DataParallel:
    """Make an existing ``torch.nn.DataParallel`` call replication callbacks after each replicate.

    Harmless on wrappers that already call them (:class:`~encoding.parallel.DataParallelModel`): callbacks run once
    per replication.

    Args:
        data_parallel: the wrapper (built elsewhere) to patch in place.

    Returns:
        The same object, for chaining.

    Example:
        >>> dp = patch_replication_callback(nn.DataParallel(nn.Linear(2, 2), device_ids=[]))
    """
    if not isinstance(data_parallel, nn.DataParallel):
        raise TypeError(f"patch_replication_callback expects a torch.nn.DataParallel, got {type(data_parallel).__name__}")
    original = data_parallel.replicate

    @functools.wraps(original)
    def replicate_with_callback(module, device_ids):
        replicas = original(module, device_ids)
        execute_replication_callbacks(replicas)
        return replicas

    data_parallel.replicate = replicate_with_callback
    return data_parallel
