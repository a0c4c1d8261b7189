"""What the toolkit's layer options do to a network built elsewhere (a model spec, :mod:`.external`).

* ``norm_layer=SyncBatchNorm`` (several replicas or processes): :func:`sync_batchnorm` converts its BatchNorm layers;
* ``recompute`` (``--recompute backbone|all``): :func:`recompute_spec_network` runs its backbone's blocks (and with
  ``all`` its heads) under the toolkit's exact recomputation (:mod:`encoding.nn.recompute`), as registry models'
  residual blocks are; a network without a ``backbone`` module is refused in one line, never left as it is.
"""
from __future__ import annotations

import warnings
from typing import Any, List, Optional

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import UsageError
from ..nn.recompute import RECOMPUTE_POLICIES, enable_checkpointing

__all__ = ["sync_batchnorm", "spec_backbone", "backbone_blocks", "recompute_spec_network"]


def sync_batchnorm(net: nn.Module, spec: str) -> nn.Module:
    """``net`` with its BatchNorm layers made :class:`~encoding.nn.SyncBatchNorm` (the same parameter and buffer
    tensors, state-dict keys unchanged), as registry models are built with ``norm_layer=SyncBatchNorm`` when several
    replicas or processes train: the statistics span the whole batch.

    torch's ``BatchNorm1d/2d/3d`` and ``SyncBatchNorm`` and timm's ``BatchNormAct2d`` convert exactly. A BatchNorm
    subclass with a forward of its own, or a layer named like a batch norm that is no ``_BatchNorm`` (statistics
    computed functionally), cannot: it is left as it is and a ``UserWarning`` names it (its statistics stay per
    replica).
    """
    from ..nn.syncbn import convert_sync_batchnorm, swap_modules

    kept = {name: type(m).__name__ for name, m in net.named_modules()
            if (isinstance(m, _BatchNorm) and not _converts_exactly(m))
            or (not isinstance(m, _BatchNorm) and "batchnorm" in type(m).__name__.lower()
                and "frozen" not in type(m).__name__.lower())}  # frozen: no batch statistics
    if kept:
        names = ", ".join(f"{name} ({kind})" for name, kind in list(kept.items())[:5])
        warnings.warn(f"model spec {spec}: {len(kept)} normalisation layer(s) cannot become SyncBatchNorm and keep "
                      f"per-replica statistics: {names}{' ...' if len(kept) > 5 else ''}", stacklevel=3)
    return swap_modules(net, lambda m: convert_sync_batchnorm(m) if isinstance(m, _BatchNorm)
                        and _converts_exactly(m) else None)


def _converts_exactly(layer: _BatchNorm) -> bool:
    """torch's BatchNorm forward (or SyncBatchNorm's, ours), or timm's ``BatchNormAct2d`` (drop / act modules)."""
    from ..nn.syncbn import SyncBatchNorm

    exact = (_BatchNorm.forward, nn.SyncBatchNorm.forward, SyncBatchNorm.forward)
    return type(layer).forward in exact or any(isinstance(getattr(layer, k, None), nn.Module) for k in ("drop", "act"))


def spec_backbone(net: nn.Module) -> Optional[nn.Module]:
    """The backbone of a network built elsewhere: its ``backbone`` module (torchvision's segmentation builders, a
    factory's network that names one); ``None`` when it has none (transformers' models among them)."""
    backbone = getattr(net, "backbone", None)
    return backbone if isinstance(backbone, nn.Module) else None


def backbone_blocks(backbone: nn.Module) -> List[nn.Module]:
    """The blocks to recompute: each child of the backbone, the children of a plain ``nn.Sequential`` /
    ``nn.ModuleList`` child (ResNet's ``layer1..4``: its bottlenecks); single layers (a stem conv, a norm, an
    activation) are left alone."""
    blocks: List[nn.Module] = []
    for child in backbone.children():
        parts = list(child.children()) if type(child) in (nn.Sequential, nn.ModuleList) else [child]
        blocks += [part for part in parts if any(True for _ in part.children())]
    return blocks


def recompute_spec_network(net: nn.Module, policy: Any, spec: str) -> nn.Module:
    """Apply a recomputation policy to ``net`` (the network of ``spec``); returns ``net``.

    Args:
        policy: ``False`` / ``None`` / ``"none"``: nothing; ``"backbone"``: every block of :func:`backbone_blocks`;
            ``"all"`` or ``True``: the blocks and every other top-level module with parameters (the heads).

    Raises:
        UsageError: an unknown policy, or a network without a backbone of blocks (one line naming the spec).
    """
    policy = {False: "none", None: "none", True: "all"}.get(policy, policy)
    if policy not in RECOMPUTE_POLICIES:
        raise UsageError(f"model spec {spec}: --recompute {policy}: one of {', '.join(RECOMPUTE_POLICIES)}")
    if policy == "none":
        return net
    backbone = spec_backbone(net)
    blocks = backbone_blocks(backbone) if backbone is not None else []
    if not blocks:
        raise UsageError(f"--recompute {policy}: model spec {spec} has no backbone of blocks to recompute "
                         "(torchvision's segmentation networks have one; a factory's network needs a 'backbone' "
                         "module); use --recompute none")
    enable_checkpointing(blocks)
    if policy == "all":
        heads = [m for m in net.children() if m is not backbone and any(True for _ in m.parameters())]
        enable_checkpointing(heads)
    return net
