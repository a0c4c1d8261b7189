"""Small typed builders for your own training or evaluation script (``experiments/segmentation`` uses them too).

Each builder does one job and takes plain, typed arguments (no ``argparse`` namespace):

* :func:`select_devices` → a :class:`Placement`: ``DataParallelModel`` devices, or one device per ``torchrun``
  process (DDP);
* :func:`build_model` / :func:`build_criterion`: a segmentation model (``SyncBatchNorm`` when ``sync_bn``) and its
  loss (:data:`~encoding.nn.LOSSES`: cross-entropy, OHEM, Dice, Focal, Lovász-Softmax; optional class weights);
* :func:`build_loaders`: training and validation ``DataLoader``\\ s (distributed samplers under DDP);
* :func:`param_groups` / :func:`build_optimizer` / :func:`build_scheduler`: the backbone/head parameter groups,
  SGD or AdamW over them, and the per-iteration :class:`~encoding.utils.lr_scheduler.IterationLR` (torch style:
  ``scheduler.step()`` after each ``optimizer.step()``);
* :func:`wrap_model`: :class:`~encoding.parallel.DataParallelModel` + :class:`~encoding.parallel.DataParallelCriterion`
  (optionally ``balance="memory"``), or under ``torchrun`` one of :data:`STRATEGIES`: ``DistributedDataParallel``
  (``ddp``, ``zero1``: with ``build_optimizer(zero_redundancy=True)``) or FSDP2 ``fully_shard`` (``fsdp``);

What a run saves and how it resumes is :mod:`encoding.engine.state`'s; :mod:`encoding.engine.assemble` turns a whole
configuration into a run with these builders.

Example:
    >>> placement = select_devices(["cpu", "cpu"])                                        # doctest: +SKIP
    >>> model = build_model("fcn", "shapes", backbone="resnet18", sync_bn=placement.synced)  # doctest: +SKIP
    >>> criterion = build_criterion(7)                                                    # doctest: +SKIP
    >>> model, criterion = wrap_model(model, criterion, placement)                        # doctest: +SKIP
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from ..config import AUX_WEIGHT_LIBRARY, OPTIMIZERS, STRATEGIES
from ..utils.renamed import renamed_keyword
from ..datasets import get_segmentation_dataset, list_collate, warn_shared_images
from ..datasets.class_weights import resolve_class_weights
from ..errors import UsageError
from ..models import SegmentationModel
from ..models.factory import nclass_of
from ..models.network import NetworkSpec
from ..models.spec_layers import spec_backbone
from ..nn.loss import LOSSES, SegmentationLosses
from ..parallel import DataParallelCriterion, DataParallelModel, resolve_devices
from ..utils.determinism import EpochSampler, SeededSamples, seed_worker
from ..utils.dist import (ShardSampler, fsdp_units, get_local_rank, get_world_size, is_main_process,
                          launched_by_torchrun)
from ..utils.lr_scheduler import IterationLR
from ..utils.optim import optimizer_settings
from .compiled import compile_mode, compile_model

__all__ = ["Placement", "Loaders", "select_devices", "build_model", "build_criterion", "build_loaders",
           "build_eval_loader", "OPTIMIZERS", "param_groups", "build_optimizer", "build_scheduler", "STRATEGIES",
           "strategy_problem", "torchrun_problem", "wrap_model"]


@dataclass(frozen=True)
class Placement:
    """Where a run executes.

    Attributes:
        device_ids: devices of :class:`~encoding.parallel.DataParallelModel` (empty under DDP).
        model_device: where the model's parameters live.
        input_device: where the loop moves each batch (``None``: leave it on the CPU for ``DataParallelModel``
            to scatter).
        distributed: one process per device under ``torchrun`` (DDP).
    """

    device_ids: List[torch.device]
    model_device: torch.device
    input_device: Optional[torch.device]
    distributed: bool

    @property
    def synced(self) -> bool:
        """Whether several replicas or processes share each batch (so BatchNorm should be synchronized)."""
        return self.distributed or len(self.device_ids) > 1


class Loaders(NamedTuple):
    """The training and validation loaders, and the samplers to reshuffle each epoch (``set_epoch``)."""

    train: DataLoader
    val: DataLoader
    samplers: List[DistributedSampler]


def select_devices(device_ids: Optional[Sequence[Union[int, str, torch.device]]] = None, *, use_cuda: bool = True,
                   distributed: bool = False) -> Placement:
    """Choose the devices of a run.

    Args:
        device_ids: devices for ``DataParallelModel`` (e.g. ``[0, 1]`` or ``["cpu", "cpu"]``); ``None``: every CUDA
            device, or the CPU when CUDA is absent or ``use_cuda`` is false.
        use_cuda: allow CUDA.
        distributed: running under ``torchrun``: this process uses ``cuda:LOCAL_RANK`` (or the CPU) and DDP.

    Raises:
        ValueError: bad device ids.
    """
    cuda = use_cuda and torch.cuda.is_available()
    if distributed:
        device = torch.device("cuda", get_local_rank()) if cuda else torch.device("cpu")
        return Placement([], device, device, True)
    ids = resolve_devices(list(device_ids) if device_ids is not None else (None if cuda else []))
    return Placement(ids, ids[0] if ids else torch.device("cpu"), None, False)


def build_model(name: str, dataset: str, *, backbone: str = "resnet50", aux: bool = False, se_loss: bool = False,
                pretrained_backbone: Union[bool, str, os.PathLike] = False, output_stride: Optional[int] = None,
                sync_bn: bool = False, device: Optional[torch.device] = None,
                recompute: Union[bool, str] = False, head_options: Optional[dict] = None,
                nclass: Optional[int] = None, **old: Any) -> SegmentationModel:
    """A segmentation model (see :func:`~encoding.models.get_segmentation_model`) on ``device``.

    Args:
        sync_bn: use :class:`~encoding.nn.SyncBatchNorm` (several replicas or processes), else ``nn.BatchNorm2d``.
        device: move the model there (``None``: leave it on the CPU).
        recompute: activation recomputation policy: ``False`` (or ``"none"``), ``"backbone"`` or ``"all"``
            (``checkpoint=``, its old name, still works with a ``FutureWarning``).
        head_options: options of the architecture's head factory, e.g. ``{"channels": 64}`` for ``deeplabv3plus``.
        nclass: output channels (default: the dataset's class count; 1 for a binary network).
    """
    recompute = renamed_keyword(old, "checkpoint", "recompute", recompute, "build_model")
    head = dict(head_options or {})
    network = NetworkSpec(name, nclass or nclass_of(dataset), backbone=backbone, aux=aux, se_loss=se_loss,
                          output_stride=output_stride, head_channels=head.pop("channels", None), recompute=recompute,
                          sync_bn=sync_bn, pretrained_backbone=pretrained_backbone)
    if head:
        raise UsageError(f"build_model({name!r}): head options other than 'channels' (--head-channels) are given "
                         f"to encoding.models.get_segmentation_model, got {', '.join(sorted(head))}")
    return network.build(device)


def build_criterion(nclass: int, *, aux: bool = False, aux_weight: float = AUX_WEIGHT_LIBRARY, se_loss: bool = False,
                    se_weight: float = 0.2, device: Optional[torch.device] = None, loss: str = "ce",
                    class_weights: Union[None, str, os.PathLike, Sequence[float]] = None,
                    train_dataset: Optional[Dataset] = None) -> SegmentationLosses:
    """The criterion ``loss`` of :data:`~encoding.nn.LOSSES` (``ce``: :class:`~encoding.nn.SegmentationLosses`) for
    ``nclass`` classes (ignore label -1) on ``device``.

    Args:
        loss: ``ce``, ``ohem``, ``dice``, ``focal`` or ``lovasz``.
        class_weights: ``None``, ``auto`` / ``enet`` / ``median`` (from ``train_dataset``'s label frequencies,
            cached; :mod:`encoding.datasets.class_weights`), a file of ``nclass`` numbers, or the numbers.
        train_dataset: the training set that ``auto`` / ``median`` count.
    """
    weight = (torch.as_tensor(class_weights, dtype=torch.float64) if isinstance(class_weights, (list, tuple))
              else resolve_class_weights(class_weights, train_dataset, nclass))
    criterion = LOSSES.get(loss)(se_loss=se_loss, se_weight=se_weight, nclass=nclass, aux=aux, aux_weight=aux_weight,
                             ignore_index=-1, weight=None if weight is None else weight.float())
    return criterion if device is None else criterion.to(device)


def _limit(dataset: Dataset, limit: Optional[int]) -> Dataset:
    return Subset(dataset, range(min(limit, len(dataset)))) if limit else dataset


def build_loaders(dataset: str, *, batch_size: int, test_batch_size: Optional[int] = None,
                  root: Optional[str] = None, train_split: str = "train", val_split: str = "val",
                  base_size: Optional[int] = None, crop_size: Optional[int] = None, workers: int = 2,
                  train_limit: Optional[int] = None, val_limit: Optional[int] = None, distributed: bool = False,
                  seed: int = 0, pin_memory: bool = False, skip_bad: bool = False,
                  scale_range: Optional[Tuple[float, float]] = None,
                  datasets: Optional[Tuple[Dataset, Dataset]] = None,
                  dataset_options: Optional[Dict[str, Any]] = None, validated: bool = True) -> Loaders:
    """Training (``train`` mode, shuffled) and validation (``val`` mode) loaders of a registered dataset.

    The training order and each sample's augmentation depend only on ``(seed, epoch, sample)``
    (:class:`~encoding.utils.determinism.EpochSampler` + :class:`~encoding.utils.determinism.SeededSamples`), and
    the loaders never draw from the global RNG, so a run resumed mid-epoch sees the same data as an uninterrupted
    one, with any number of workers. Call ``samplers[0].set_epoch(epoch, start=...)`` before each epoch.

    Args:
        dataset: name in :data:`encoding.datasets.datasets`.
        batch_size: training batch (per process under DDP); ``test_batch_size`` defaults to it. The last partial
            batch is dropped, unless the process's share of the training set is smaller than one batch.
        root, train_split, val_split, base_size, crop_size: passed to the dataset.
        workers: DataLoader workers (kept alive between epochs).
        train_limit, val_limit: use only the first N samples.
        distributed: split the samples over the processes (the training order seeded with ``seed``).
        pin_memory: pin batches (for CUDA).
        skip_bad: skip unusable samples with a warning instead of raising (see :class:`~encoding.datasets.BaseDataset`).
        scale_range: relative range of the training long side (default: the dataset's ``SCALE_RANGE``).
        datasets: ``(train, val)`` dataset objects to load instead of building ``dataset``'s (e.g. a small
            generated set in a test); the options that build a dataset (root, splits, sizes, skip_bad, scale_range)
            are then the caller's.
        dataset_options: more keywords of the dataset class (e.g. the ``folder`` dataset's ``val_fraction``).
        validated: the validation set is scored (then one sharing the training set's images is warned of).
    """
    if datasets is None:
        sizes = dict(base_size=base_size, crop_size=crop_size, skip_bad=skip_bad, **(dataset_options or {}))
        datasets = (get_segmentation_dataset(dataset, root=root, split=train_split, mode="train",
                                             scale_range=scale_range, **sizes),
                    get_segmentation_dataset(dataset, root=root, split=val_split, mode="val", **sizes))
        if validated and is_main_process():
            warn_shared_images(*datasets)
    train_set, val_set = datasets
    train_set, val_set = _limit(train_set, train_limit), _limit(val_set, val_limit)
    train_sampler = EpochSampler(train_set, shuffle=True, seed=seed, distributed=distributed)
    val_sampler = ShardSampler(val_set) if distributed else None  # no padding: each sample scored once
    common = dict(num_workers=workers, pin_memory=pin_memory, persistent_workers=workers > 0,
                  worker_init_fn=seed_worker)
    train = DataLoader(SeededSamples(train_set, seed), batch_size=batch_size, sampler=train_sampler,
                       drop_last=len(train_sampler) > batch_size,  # this process's share
                       generator=torch.Generator().manual_seed(seed), **common)
    val = DataLoader(val_set, batch_size=test_batch_size or batch_size, shuffle=False, sampler=val_sampler,
                     generator=torch.Generator().manual_seed(seed), **common)
    return Loaders(train, val, [train_sampler])


def build_eval_loader(dataset: str, *, split: str = "val", mode: str = "val", batch_size: int = 16,
                      root: Optional[str] = None, base_size: Optional[int] = None, crop_size: Optional[int] = None,
                      workers: int = 2, limit: Optional[int] = None, distributed: bool = False,
                      data: Optional[Dataset] = None, dataset_options: Optional[Dict[str, Any]] = None) -> DataLoader:
    """An evaluation loader that also yields each sample's file name (last element of every batch).

    Args:
        mode: ``val`` (resized centre crops, batched like the training run's validation), ``testval`` (whole
            images with masks) or ``test`` (whole images, no masks); the last two come as per-sample lists
            (:func:`~encoding.datasets.list_collate`) for :func:`~encoding.engine.evaluate_images`.
        limit: use only the first N samples.
        distributed: this process's shard of the samples (every sample exactly once over all processes).
        data: a dataset object (built with ``return_name=True``) to load instead of building ``dataset``'s.
    """
    if data is None:
        data = get_segmentation_dataset(dataset, root=root, split=split, mode=mode, base_size=base_size,
                                        crop_size=crop_size, return_name=True, **(dataset_options or {}))
    data = _limit(data, limit)
    return DataLoader(data, batch_size=batch_size, shuffle=False, num_workers=workers,
                      sampler=ShardSampler(data) if distributed else None,
                      collate_fn=None if mode == "val" else list_collate)


def param_groups(model: nn.Module) -> List[Dict[str, Any]]:
    """Optimizer parameter groups: the backbone first, then everything else (the heads).

    :class:`~encoding.utils.lr_scheduler.IterationLR` gives group 0 the base learning rate and later groups
    ``head_lr_mult`` times it (10x: the PyTorch-Encoding convention for pretrained backbones and new heads). The
    backbone is the model's ``backbone`` module, a spec network's (``torchvision:`` / ``module:factory``, wrapped in
    :class:`~encoding.models.external.ExternalModel`) its network's
    (:func:`~encoding.models.spec_layers.spec_backbone`); a model without one gives a single group.

    Args:
        model: the (possibly wrapped) segmentation model.

    Returns:
        A list of ``{"params": [...]}`` dicts for ``torch.optim``; parameters with ``requires_grad=False`` are left out.
    """
    module = getattr(model, "module", model)
    backbone = getattr(module, "backbone", None)
    if not isinstance(backbone, nn.Module) and isinstance(getattr(module, "net", None), nn.Module):
        backbone = spec_backbone(module.net)  # a spec network's
    trainable = [p for p in module.parameters() if p.requires_grad]
    if not isinstance(backbone, nn.Module):
        return [{"params": trainable}]
    backbone_ids = {id(p) for p in backbone.parameters()}
    return [{"params": [p for p in trainable if id(p) in backbone_ids]},
            {"params": [p for p in trainable if id(p) not in backbone_ids]}]


def build_optimizer(model: nn.Module, lr: float, *, kind: str = "sgd", momentum: float = 0.9,
                    weight_decay: float = 1e-4, zero_redundancy: bool = False) -> torch.optim.Optimizer:
    """The optimizer over :func:`param_groups` (backbone first, then the heads).

    Build it over the wrapped model (:func:`wrap_model`): FSDP2 replaces the parameters by their shards.

    Args:
        kind: ``"sgd"`` (PyTorch-Encoding's: SGD with ``momentum``) or ``"adamw"`` (fast from scratch, e.g. the
            ``shapes`` recipe; ``momentum`` is unused).
        weight_decay: L2 (SGD) or decoupled (AdamW) weight decay.
        zero_redundancy: ZeRO-1 (``--strategy zero1``): the same optimizer and groups in a
            ``torch.distributed.optim.ZeroRedundancyOptimizer``, each process keeping the state of its share of the
            parameters (its ``param_groups`` are the whole groups: the schedule sets their rates as usual).

    Raises:
        ValueError: unknown ``kind``.
    """
    cls, options = optimizer_settings(kind, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if zero_redundancy:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(param_groups(model), optimizer_class=cls, **options)
    return cls(param_groups(model), **options)


def build_scheduler(optimizer: torch.optim.Optimizer, mode: str, lr: float, epochs: int, iters_per_epoch: int, *,
                    lr_step: int = 0, warmup_epochs: float = 0, head_lr_mult: float = 10.0) -> IterationLR:
    """The per-iteration schedule of ``optimizer`` (:class:`~encoding.utils.lr_scheduler.IterationLR`): it sets the
    rates of iteration 0 now; ``scheduler.step()`` after each ``optimizer.step()`` moves to the next iteration."""
    return IterationLR(optimizer, mode, lr, epochs, iters_per_epoch, lr_step=lr_step, warmup_epochs=warmup_epochs,
                       head_lr_mult=head_lr_mult)


def strategy_problem(strategy: str, amp: str = "none", distributed: Optional[bool] = None) -> Optional[str]:
    """Why ``--strategy`` cannot run with these options (a one-line message), or ``None`` when it can.

    Args:
        strategy: one of :data:`STRATEGIES`.
        amp: the ``--amp`` choice (``fsdp`` takes ``bf16``, not ``fp16``: its gradient scaler would see a shard).
        distributed: launched by ``torchrun`` (default: ``RANK`` / ``WORLD_SIZE`` in the environment).
    """
    if strategy not in STRATEGIES:
        return f"--strategy {strategy}: {STRATEGIES.unknown(strategy)}"
    distributed = launched_by_torchrun() if distributed is None else distributed
    if strategy != "ddp" and not distributed:
        return (f"--strategy {strategy} shards the run over torchrun processes: start it with torchrun "
                "--nproc_per_node N train.py ... (without torchrun one process uses DataParallelModel)")
    if strategy == "fsdp" and amp == "fp16":
        return "--amp fp16 with --strategy fsdp: use --amp bf16 (no gradient scaler over sharded gradients)"
    return None


def torchrun_problem(balance: str, device_ids: Optional[str], distributed: Optional[bool] = None) -> Optional[str]:
    """Why options of one process driving several devices cannot run under ``torchrun`` (one device per process:
    ``cuda:LOCAL_RANK``, or the CPU), or ``None``."""
    distributed = launched_by_torchrun() if distributed is None else distributed
    if distributed and balance not in (None, "none"):
        return (f"--balance {balance} splits a batch over the devices of one process; under torchrun each process "
                "has one device: drop --balance")
    if distributed and device_ids is not None:
        return (f"--device-ids {device_ids}: under torchrun each process takes cuda:LOCAL_RANK (or the CPU with "
                "--no-cuda): drop --device-ids (CUDA_VISIBLE_DEVICES chooses the GPUs)")
    return None


def balance_problem(balance: str, device_ids: Optional[Sequence[Any]], use_cuda: bool) -> Optional[str]:
    """Why ``--balance`` has nothing to balance (one process driving one device of ``device_ids``, parsed), or
    ``None``."""
    if balance in (None, "none") or launched_by_torchrun():  # torchrun: torchrun_problem's
        return None
    devices = select_devices(device_ids, use_cuda=use_cuda).device_ids
    if len(devices) < 2:
        return (f"--balance {balance} splits each batch over several devices; this run has one "
                f"({devices[0] if devices else 'the CPU'}): drop --balance, or give --device-ids of two or more")
    return None


def _fully_shard(model: nn.Module, device: torch.device) -> nn.Module:
    """FSDP2 over :func:`~encoding.utils.dist.fsdp_units` (reshard after forward), from rank 0's weights."""
    from torch.distributed import broadcast
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.no_grad():  # every rank shards the same weights (DDP broadcasts them; fully_shard does not)
        for tensor in [*model.parameters(), *model.buffers()]:
            broadcast(tensor, src=0)
    mesh = init_device_mesh(device.type, (get_world_size(),))
    for unit in fsdp_units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=True)
    return model


def wrap_model(model: nn.Module, criterion: nn.Module, placement: Placement, *,
               balance: Optional[str] = None, strategy: str = "ddp", compile: str = "none",
               optimizer: Optional[Dict[str, Any]] = None) -> Tuple[nn.Module, nn.Module]:
    """Wrap for the placement: ``DataParallelModel`` + ``DataParallelCriterion`` (exact loss reduction), or under
    ``torchrun`` the ``strategy``.

    Args:
        model: the model, already on ``placement.model_device``.
        criterion: its loss.
        placement: from :func:`select_devices`.
        balance: ``None`` (even split) or ``"memory"`` (``DataParallelModel`` only): per-device split sizes chosen
            by the memory simulator (:class:`~encoding.memory.MemoryBalancer`) for this criterion and ``optimizer``.
        optimizer: the run's :func:`build_optimizer` options (``kind``, ``momentum``, ``weight_decay``: what device 0
            holds; default: its defaults), read by ``balance``.
        strategy: under ``torchrun``: ``"ddp"`` and ``"zero1"`` (``DistributedDataParallel``; ZeRO-1 is the
            optimizer's, :func:`build_optimizer`), or ``"fsdp"``: FSDP2 ``fully_shard`` on each module of
            :func:`~encoding.utils.dist.fsdp_units` in order (the backbone's stages, the heads, then the root).
        compile: ``--compile``: ``"none"``, ``"auto"`` or a ``torch.compile`` mode; the network is compiled
            (:func:`~encoding.engine.compiled.compile_model`) before it is wrapped.

    Returns:
        ``(model, criterion)`` wrapped; build the optimizer over this model.

    Raises:
        ValueError: ``balance`` under ``torchrun`` (each process holds one device, there is nothing to balance), or a
            ``strategy`` other than ``"ddp"`` without it (:func:`strategy_problem`).
    """
    problem = strategy_problem(strategy, distributed=placement.distributed)
    if problem:
        raise ValueError(problem)
    devices = placement.device_ids or [placement.model_device]
    if compile_mode(compile, devices):
        compile_model(model, compile_mode(compile, devices), devices=devices)
    if placement.distributed:
        if balance is not None:
            raise ValueError("balance applies to DataParallelModel; under torchrun (DDP) each process has one device")
        device = placement.model_device
        if strategy == "fsdp":
            return _fully_shard(model, device), criterion
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        return ddp, criterion
    if balance == "memory":  # simulate this run's own loss and optimizer on each device
        from ..memory import MemoryBalancer, optimizers as memory
        balance = MemoryBalancer(criterion, optimizer=memory.training_optimizer(model, param_groups(model), optimizer))
    return (DataParallelModel(model, placement.device_ids, balance=balance),
            DataParallelCriterion(criterion, placement.device_ids))
