"""Options → a :class:`TrainingRun`: the experiments' assembly of the library's builders (``encoding.builders``).

Config is translated here, at the edge: the library builders take typed arguments, this module reads the
``argparse.Namespace`` of ``option.py`` (shared by the scripts of this folder).

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
from torch.utils.data import DataLoader, Subset

from encoding import builders
from encoding.datasets import datasets as DATASETS
from encoding.engine import predicted_labels
from encoding.engine.inference import PredictionWriter
from encoding.models import MultiEvalModule, get_model, get_segmentation_model
from encoding.parallel import DataParallelModel
from encoding.utils import LR_Scheduler, SegmentationMetric, get_rank, get_world_size, init_distributed_mode
from encoding.utils.determinism import SeededSamples, rng_state, set_rng_state
from option import AMP_DTYPES, parse_device_ids

__all__ = ["TrainingRun", "build_run", "run_directory", "EvaluationJob", "build_evaluation", "load_model",
           "multi_scale"]


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
    start_iteration: int = 0
    best_pred: float = 0.0
    best_epoch: int = -1
    samplers: List[Any] = field(default_factory=list)

    def set_epoch(self, epoch: int, start_iteration: int = 0) -> None:
        """Order the training samples for ``epoch``, skipping its first ``start_iteration`` batches."""
        for sampler in self.samplers:
            sampler.set_epoch(epoch, start=start_iteration * self.train_loader.batch_size)

    def checkpoint_state(self, epoch: int, best_pred: float, best_epoch: int, metrics: Dict[str, Any],
                         iteration: int = 0, log_row: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """The state :func:`encoding.utils.save_checkpoint` writes after ``epoch`` (the last complete epoch; with
        ``iteration > 0``, that many iterations of the next epoch are done too), RNG states included."""
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler, "scaler": self.scaler,
                "epoch": epoch, "iteration": iteration, "best_pred": best_pred, "best_epoch": best_epoch,
                "args": vars(self.args), "rng": rng_state(), "log_row": log_row or {},
                "metrics": {k: metrics[k] for k in ("pixAcc", "mIoU") if k in metrics}}

    def datasets(self) -> List[Any]:
        """The training and validation datasets themselves (under ``Subset`` / seeding wrappers)."""
        return [_base_dataset(loader) for loader in (self.train_loader, self.val_loader)]

    def describe(self) -> str:
        """A one-paragraph summary of the run for the log."""
        where = (f"DDP rank {get_rank()}/{get_world_size()}" if self.distributed
                 else f"DataParallelModel on {[str(d) for d in self.device_ids] or ['cpu (direct)']}")
        a = self.args
        return (f"{a.model}-{a.backbone} on {a.dataset}: {len(self.train_loader.dataset)} train / "
                f"{len(self.val_loader.dataset)} val samples, batch {a.batch_size}, {a.epochs} epochs, lr {a.lr}, "
                f"{where}; writing to {self.output_dir}")


def _base_dataset(loader: DataLoader) -> Any:
    dataset = loader.dataset
    while isinstance(dataset, (Subset, SeededSamples)):
        dataset = dataset.dataset
    return dataset


def _class_names(loader: DataLoader) -> List[str]:
    return list(type(_base_dataset(loader)).CLASSES)


def run_directory(args: argparse.Namespace) -> str:
    """``<output-dir>/<dataset>/<model>/<checkname>``: where a run writes its checkpoints and logs."""
    return os.path.join(args.output_dir, args.dataset, args.model, args.checkname)


def build_run(args: argparse.Namespace) -> TrainingRun:
    """Build a :class:`TrainingRun` from parsed options (see ``option.py``).

    Raises:
        ValueError: unknown dataset/model/backbone (listing the valid names) or bad device ids.
    """
    distributed = init_distributed_mode()
    torch.manual_seed(args.seed + get_rank())
    placement = builders.select_devices(parse_device_ids(args.device_ids), use_cuda=not args.no_cuda,
                                        distributed=distributed)
    device = placement.model_device
    loaders = builders.build_loaders(
        args.dataset, batch_size=args.batch_size, test_batch_size=args.test_batch_size, root=args.data_root,
        train_split=args.train_split, val_split=args.val_split, base_size=args.base_size, crop_size=args.crop_size,
        workers=args.workers, train_limit=args.train_limit, val_limit=args.val_limit, distributed=distributed,
        seed=args.seed, pin_memory=device.type == "cuda", skip_bad=args.skip_bad, scale_range=args.scale_range)
    class_names = _class_names(loaders.train)
    nclass = len(class_names)
    model = builders.build_model(args.model, args.dataset, backbone=args.backbone, aux=args.aux,
                                 se_loss=args.se_loss, pretrained_backbone=args.pretrained,
                                 output_stride=args.output_stride, sync_bn=placement.synced, device=device,
                                 checkpoint=False if args.checkpoint == "none" else args.checkpoint,
                                 head_options=_head_options(args))
    criterion = builders.build_criterion(nclass, aux=args.aux, aux_weight=args.aux_weight, se_loss=args.se_loss,
                                         se_weight=args.se_weight, device=device)
    optimizer = builders.build_optimizer(model, args.lr, kind=args.optimizer, momentum=args.momentum,
                                         weight_decay=args.weight_decay)
    scheduler = builders.build_scheduler(args.lr_scheduler, args.lr, args.epochs, len(loaders.train),
                                         lr_step=args.lr_step, warmup_epochs=args.warmup_epochs,
                                         head_lr_mult=args.head_lr_mult)
    amp_dtype = AMP_DTYPES[args.amp]
    scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
    point = builders.ResumePoint(args.start_epoch, 0, 0.0, -1, None)
    if args.resume:
        if args.ft or args.eval:  # fine-tune or evaluate: restore the weights only
            builders.resume(args.resume, model)
        else:
            point = builders.load_training_state(args.resume, model, optimizer, scaler)
            if point.rng is not None:  # the model's own randomness (dropout) continues where it stopped
                set_rng_state(point.rng)
    model, criterion = builders.wrap_model(model, criterion, placement,
                                           balance=None if args.balance == "none" else args.balance)
    return TrainingRun(args=args, model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                       train_loader=loaders.train, val_loader=loaders.val,
                       metric=SegmentationMetric(nclass, ignore_index=-1, device=device),
                       class_names=class_names,
                       output_dir=run_directory(args),
                       input_device=placement.input_device, device_ids=placement.device_ids,
                       distributed=distributed, amp_dtype=amp_dtype, scaler=scaler, start_epoch=point.epoch,
                       start_iteration=point.iteration, best_pred=point.best_pred, best_epoch=point.best_epoch,
                       samplers=loaders.samplers)


# ---------------------------------------------------------------------------------------------- test.py / demo.py
def load_model(args: argparse.Namespace, device: torch.device) -> nn.Module:
    """The network of ``--resume`` / ``--model-zoo`` / ``--pretrained torchvision``, on ``device``, in eval mode.

    Raises:
        CheckpointError, ValueError, RuntimeError: unreadable or mismatching weights, unknown names, offline.
    """
    if args.model_zoo:
        model = get_model(args.model_zoo, pretrained=True)
    elif args.pretrained == "torchvision":
        model = get_segmentation_model(args.model, dataset=args.dataset, backbone=args.backbone, aux=args.aux,
                                       pretrained="torchvision")
    else:
        model = builders.build_model(args.model, args.dataset, backbone=args.backbone, aux=args.aux,
                                     se_loss=args.se_loss, output_stride=args.output_stride,
                                     head_options=_head_options(args))
        builders.resume(args.resume, model)
    return model.to(device).eval()


def _head_options(args: argparse.Namespace) -> Optional[dict]:
    """``--head-channels`` as the head factory's option (``None``: the model's default width)."""
    return {"channels": args.head_channels} if args.head_channels else None


def multi_scale(model: nn.Module, args: argparse.Namespace) -> nn.Module:
    """``model`` inside a :class:`~encoding.models.MultiEvalModule` (``--scales`` + flip) with ``--multi-scale``,
    else ``model`` itself."""
    if not args.multi_scale:
        return model
    dataset = DATASETS[args.dataset]
    return MultiEvalModule(model, dataset.NUM_CLASS, base_size=args.base_size or dataset.BASE_SIZE,
                           crop_size=args.crop_size or dataset.CROP_SIZE, scales=args.scales)


def weights_source(args: argparse.Namespace) -> str:
    """``--resume PATH`` / ``--model-zoo NAME`` / ``--pretrained torchvision``, as given."""
    return args.resume or (f"model-zoo:{args.model_zoo}" if args.model_zoo else "torchvision")


@dataclass
class EvaluationJob:
    """What ``test.py`` needs; built by :func:`build_evaluation`."""

    args: argparse.Namespace
    model: nn.Module
    loader: DataLoader
    metric: SegmentationMetric
    class_names: List[str]
    devices: List[torch.device]
    input_device: Optional[torch.device]
    out_dir: str
    weights: str
    amp_dtype: Optional[torch.dtype] = None
    writer: Optional[PredictionWriter] = None

    def write_predictions(self, outputs: Any, batch: Any) -> None:
        """``on_outputs`` hook of the evaluation loops: save the batch's predictions (with ``--save-pred``)."""
        if self.writer is not None:
            self.writer(predicted_labels(outputs), list(batch[-1]))

    def describe(self) -> str:
        a = self.args
        where = (f"rank {get_rank()}/{get_world_size()}" if get_world_size() > 1
                 else f"devices {[str(d) for d in self.devices]}")
        how = f"multi-scale {list(a.scales)} + flip" if a.multi_scale else "single scale"
        return (f"{a.model}-{a.backbone} ({self.weights}) on {a.dataset} {a.split!r} ({len(self.loader.dataset)} "
                f"samples, mode {a.mode}, {how}), {where}")


def build_evaluation(args: argparse.Namespace) -> EvaluationJob:
    """Build an :class:`EvaluationJob` from ``test.py``'s parsed options.

    ``val`` mode: batches of ``--test-batch-size`` through :class:`~encoding.parallel.DataParallelModel` on the
    devices; ``testval`` / ``test``: whole images, one per device (:func:`encoding.engine.evaluate_images`), through
    :class:`~encoding.models.MultiEvalModule` with ``--multi-scale``. Under ``torchrun`` each process evaluates its
    shard of the samples on its own device.
    """
    distributed = init_distributed_mode()
    placement = builders.select_devices(parse_device_ids(args.device_ids), use_cuda=not args.no_cuda,
                                        distributed=distributed)
    device = placement.model_device
    devices = list(placement.device_ids) or [device]
    model = multi_scale(load_model(args, device), args)
    dataset_class = DATASETS[args.dataset]
    nclass = dataset_class.NUM_CLASS
    if args.mode == "val":
        batch_size = args.test_batch_size
        if not distributed:
            model = DataParallelModel(model, placement.device_ids)
    else:
        batch_size = len(devices)
    out_dir = args.out_dir or (os.path.dirname(os.path.abspath(args.resume)) if args.resume
                               else os.path.join("runs", args.dataset, args.model, "eval"))
    return EvaluationJob(
        args=args, model=model,
        loader=builders.build_eval_loader(args.dataset, split=args.split, mode=args.mode, batch_size=batch_size,
                                          root=args.data_root, base_size=args.base_size, crop_size=args.crop_size,
                                          workers=args.workers, limit=args.limit, distributed=distributed),
        metric=SegmentationMetric(nclass, ignore_index=-1, device=device), class_names=list(dataset_class.CLASSES),
        devices=devices, input_device=placement.input_device, out_dir=out_dir, weights=weights_source(args),
        amp_dtype=AMP_DTYPES[args.amp],
        writer=PredictionWriter(args.save_pred, args.dataset) if args.save_pred else None)  # each rank: its shard
