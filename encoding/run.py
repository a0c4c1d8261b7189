"""Assemble everything a training run needs from command-line options (config is translated here, at the edge).

:func:`build_run` turns an ``argparse.Namespace`` (see ``experiments/segmentation/option.py``) into a
:class:`TrainingRun`: devices, datasets and loaders, model (with SyncBatchNorm when several replicas or processes
share the batch), loss, optimizer with the backbone/head split, PE learning-rate schedule, mixed precision, resume.

Device policy:
    * launched by ``torchrun``: one device per process, ``DistributedDataParallel`` (nccl on CUDA, gloo on CPU);
    * otherwise: one process drives ``--device-ids`` (default: every CUDA device, or the CPU) through
      :class:`~encoding.parallel.DataParallelModel` + :class:`~encoding.parallel.DataParallelCriterion`.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from .datasets import get_segmentation_dataset
from .engine import param_groups
from .models import get_segmentation_model
from .nn import SegmentationLosses, SyncBatchNorm
from .parallel import DataParallelCriterion, DataParallelModel, resolve_devices
from .utils import (LR_Scheduler, SegmentationMetric, get_local_rank, get_rank, get_world_size,
                    init_distributed_mode, load_checkpoint)

__all__ = ["TrainingRun", "build_run", "parse_device_ids"]

_AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainingRun:
    """Everything the training loop needs; built by :func:`build_run`."""

    args: argparse.Namespace
    model: nn.Module
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LR_Scheduler
    train_loader: DataLoader
    val_loader: DataLoader
    metric: SegmentationMetric
    class_names: List[str]
    output_dir: str
    input_device: Optional[torch.device]
    device_ids: List[torch.device]
    distributed: bool
    amp_dtype: Optional[torch.dtype] = None
    scaler: Optional[torch.amp.GradScaler] = None
    start_epoch: int = 0
    best_pred: float = 0.0
    samplers: List[Any] = field(default_factory=list)

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle distributed samplers for ``epoch``."""
        for sampler in self.samplers:
            sampler.set_epoch(epoch)

    def checkpoint_state(self, epoch: int, best_pred: float, metrics: Dict[str, Any]) -> Dict[str, Any]:
        """The state :func:`encoding.utils.save_checkpoint` writes after ``epoch``."""
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler, "scaler": self.scaler,
                "epoch": epoch, "best_pred": best_pred, "args": vars(self.args),
                "metrics": {k: metrics[k] for k in ("pixAcc", "mIoU") if k in metrics}}

    def describe(self) -> str:
        """A one-paragraph summary of the run for the log."""
        where = (f"DDP rank {get_rank()}/{get_world_size()}" if self.distributed
                 else f"DataParallelModel on {[str(d) for d in self.device_ids] or ['cpu (direct)']}")
        a = self.args
        return (f"{a.model}-{a.backbone} on {a.dataset}: {len(self.train_loader.dataset)} train / "
                f"{len(self.val_loader.dataset)} val samples, batch {a.batch_size}, {a.epochs} epochs, lr {a.lr}, "
                f"{where}; writing to {self.output_dir}")


def parse_device_ids(text: Optional[str]) -> Optional[List[Any]]:
    """``"0,1"`` -> ``[0, 1]``; ``"cpu,cpu"`` -> ``["cpu", "cpu"]``; ``None``/``""`` -> ``None`` (the default)."""
    if not text:
        return None
    return [int(item) if item.strip().isdigit() else item.strip() for item in text.split(",") if item.strip()]


def _devices(args: argparse.Namespace, distributed: bool):
    """``(device_ids for DataParallelModel, device of the model, device the loop moves inputs to)``."""
    use_cuda = torch.cuda.is_available() and not args.no_cuda
    if distributed:
        device = torch.device("cuda", get_local_rank()) if use_cuda else torch.device("cpu")
        return [], device, device
    requested = parse_device_ids(args.device_ids)
    device_ids = resolve_devices(requested if requested is not None else (None if use_cuda else []))
    model_device = device_ids[0] if device_ids else torch.device("cpu")
    return device_ids, model_device, None


def _limit(dataset: Dataset, limit: Optional[int]) -> Dataset:
    return Subset(dataset, range(min(limit, len(dataset)))) if limit else dataset


def _loaders(args: argparse.Namespace, distributed: bool, pin_memory: bool):
    sizes = dict(base_size=args.base_size, crop_size=args.crop_size)
    train_set = get_segmentation_dataset(args.dataset, root=args.data_root, split=args.train_split, mode="train",
                                         **sizes)
    val_set = get_segmentation_dataset(args.dataset, root=args.data_root, split=args.val_split, mode="val", **sizes)
    train_set, val_set = _limit(train_set, args.train_limit), _limit(val_set, args.val_limit)
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed) if distributed else None
    val_sampler = DistributedSampler(val_set, shuffle=False) if distributed else None
    common = dict(num_workers=args.workers, pin_memory=pin_memory, persistent_workers=args.workers > 0)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=train_sampler is None,
                              sampler=train_sampler, drop_last=len(train_set) > args.batch_size, **common)
    val_loader = DataLoader(val_set, batch_size=args.test_batch_size, shuffle=False, sampler=val_sampler, **common)
    return train_loader, val_loader, [s for s in (train_sampler,) if s is not None]


def _class_names(dataset: Dataset) -> List[str]:
    base = dataset.dataset if isinstance(dataset, Subset) else dataset
    return list(type(base).CLASSES)


def build_run(args: argparse.Namespace) -> TrainingRun:
    """Build a :class:`TrainingRun` from parsed options (see ``experiments/segmentation/option.py``).

    Raises:
        ValueError: unknown dataset/model/backbone (listing the valid names) or bad device ids.
    """
    distributed = init_distributed_mode()
    torch.manual_seed(args.seed + get_rank())
    device_ids, model_device, input_device = _devices(args, distributed)
    train_loader, val_loader, samplers = _loaders(args, distributed, pin_memory=model_device.type == "cuda")
    class_names = _class_names(train_loader.dataset)
    nclass = len(class_names)
    synced = distributed or len(device_ids) > 1
    model = get_segmentation_model(args.model, dataset=args.dataset, backbone=args.backbone, aux=args.aux,
                                   se_loss=args.se_loss, pretrained_backbone=args.pretrained,
                                   output_stride=args.output_stride,
                                   norm_layer=SyncBatchNorm if synced else nn.BatchNorm2d).to(model_device)
    criterion = SegmentationLosses(se_loss=args.se_loss, se_weight=args.se_weight, nclass=nclass, aux=args.aux,
                                   aux_weight=args.aux_weight, ignore_index=-1).to(model_device)
    optimizer = torch.optim.SGD(param_groups(model), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scheduler = LR_Scheduler(args.lr_scheduler, args.lr, args.epochs, len(train_loader), lr_step=args.lr_step,
                             warmup_epochs=args.warmup_epochs, head_multiplier=args.head_lr_mult)
    amp_dtype = _AMP_DTYPES[args.amp]
    scaler = torch.amp.GradScaler(model_device.type) if amp_dtype == torch.float16 else None
    start_epoch, best_pred = args.start_epoch, 0.0
    if args.resume:
        weights_only = args.ft or args.eval  # fine-tune or evaluate: restore the weights only
        checkpoint = load_checkpoint(args.resume, map_location="cpu", model=model,
                                     optimizer=None if weights_only else optimizer)
        if not weights_only:
            start_epoch, best_pred = checkpoint.get("epoch", -1) + 1, checkpoint.get("best_pred", 0.0)
            if scaler is not None and checkpoint.get("scaler"):  # a bf16/fp32 run saved no scaler state
                scaler.load_state_dict(checkpoint["scaler"])
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[model_device] if model_device.type == "cuda"
                                                    else None)
    else:
        model = DataParallelModel(model, device_ids)
        criterion = DataParallelCriterion(criterion, device_ids)
    output_dir = os.path.join(args.output_dir, args.dataset, args.model, args.checkname)
    return TrainingRun(args=args, model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                       train_loader=train_loader, val_loader=val_loader,
                       metric=SegmentationMetric(nclass, ignore_index=-1, device=model_device),
                       class_names=class_names, output_dir=output_dir,
                       input_device=input_device, device_ids=device_ids, distributed=distributed,
                       amp_dtype=amp_dtype, scaler=scaler, start_epoch=start_epoch, best_pred=best_pred,
                       samplers=samplers)
