"""Command-line options of the segmentation scripts (PyTorch-Encoding names), with per-dataset defaults.

The one option parser of ``experiments/segmentation``: ``train.py`` uses it, and so do the other scripts of this
folder, so option names, defaults and validation are written once.
"""
import argparse
from typing import Any, List, Optional

import torch

#: ``--amp`` choice -> autocast dtype (``None``: full precision).
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}

# Per-dataset recipe defaults (PyTorch-Encoding's train.py; lr is for batch 16 and scales linearly with the batch).
# `shapes` is the embedded offline dataset: a small model learns it in a few CPU minutes.
RECIPES = {
    "shapes": dict(epochs=16, lr=0.02, batch_size=8, model="fcn", backbone="resnet18", output_stride=16),
    "coco": dict(epochs=30, lr=0.004),
    "pascal_aug": dict(epochs=80, lr=0.001),
    "pascal_voc": dict(epochs=50, lr=0.0001),
    "pcontext": dict(epochs=80, lr=0.001),
    "ade20k": dict(epochs=180, lr=0.004),
    "citys": dict(epochs=240, lr=0.004),
}
GENERIC = dict(epochs=50, lr=0.004, batch_size=16, model="encnet", backbone="resnet50", output_stride=None)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the segmentation scripts."""
    p = argparse.ArgumentParser(description="Train / evaluate a segmentation model (encoding)")
    p.add_argument("--dataset", default="shapes", help="dataset name (default: the embedded 'shapes')")
    p.add_argument("--data-root", default=None, help="data root (default: $ENCODING_DATA or ~/.encoding/data)")
    p.add_argument("--model", default=None, help="fcn, psp, deeplab, encnet, danet, upernet, fcfpn")
    p.add_argument("--backbone", default=None, help="resnet18/34/50/101/152, resnext50_32x4d, ...")
    p.add_argument("--pretrained", action="store_true", help="start the backbone from ImageNet weights")
    p.add_argument("--aux", action="store_true", help="auxiliary FCN head on the penultimate stage")
    p.add_argument("--aux-weight", type=float, default=0.2, help="weight of the auxiliary loss (PE train.py: 0.2)")
    p.add_argument("--se-loss", action="store_true", help="semantic-encoding loss (EncNet)")
    p.add_argument("--se-weight", type=float, default=0.2)
    p.add_argument("--base-size", type=int, default=None, help="default: the dataset's")
    p.add_argument("--crop-size", type=int, default=None, help="default: the dataset's")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--start-epoch", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=None, help="total batch over all devices (per process in DDP)")
    p.add_argument("--test-batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None, help="default: the recipe's, scaled by batch/16")
    p.add_argument("--lr-scheduler", default="poly", choices=["poly", "cos", "step"])
    p.add_argument("--lr-step", type=int, default=0)
    p.add_argument("--warmup-epochs", type=int, default=0)
    p.add_argument("--head-lr-mult", type=float, default=None,
                   help="learning-rate factor of the heads (default: 10 with --pretrained, as in PE; else 1)")
    p.add_argument("--output-stride", type=int, default=None, choices=[8, 16, 32],
                   help="backbone output stride (default: the recipe's; else the model's, 8 for dilated models)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--amp", choices=list(AMP_DTYPES), default="none", help="mixed precision")
    p.add_argument("--clip-grad", type=float, default=None, help="clip the global gradient norm")
    p.add_argument("--no-cuda", action="store_true", help="train on the CPU even when CUDA is available")
    p.add_argument("--device-ids", default=None,
                   help="comma-separated devices for DataParallelModel, e.g. '0,1' or 'cpu,cpu' (default: all GPUs)")
    p.add_argument("--balance", choices=["none", "memory"], default="none",
                   help="memory: per-device split sizes chosen by the memory simulator to unload device 0")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--resume", default=None, help="checkpoint to resume from")
    p.add_argument("--ft", action="store_true", help="fine-tune: load weights only, restart epochs/optimizer")
    p.add_argument("--checkname", default="default", help="run name under runs/<dataset>/<model>/")
    p.add_argument("--output-dir", default="runs")
    p.add_argument("--eval", action="store_true", help="only evaluate (with --resume)")
    p.add_argument("--no-val", action="store_true", help="skip validation after each epoch")
    p.add_argument("--train-limit", type=int, default=None, help="use only the first N training samples")
    p.add_argument("--val-limit", type=int, default=None, help="use only the first N validation samples")
    return p


def parse_device_ids(text: Optional[str]) -> Optional[List[Any]]:
    """``"0,1"`` -> ``[0, 1]``; ``"cpu,cpu"`` -> ``["cpu", "cpu"]``; ``None``/``""`` -> ``None`` (the default)."""
    if not text:
        return None
    return [int(item) if item.strip().isdigit() else item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parse ``argv`` and fill unset options from the dataset recipe."""
    args = build_parser().parse_args(argv)
    recipe = {**GENERIC, **RECIPES.get(args.dataset, {})}
    for name in ("epochs", "batch_size", "model", "backbone", "output_stride"):
        if getattr(args, name) is None:
            setattr(args, name, recipe[name])
    if args.lr is None:
        args.lr = recipe["lr"] if args.dataset == "shapes" else recipe["lr"] * args.batch_size / 16
    if args.head_lr_mult is None:
        args.head_lr_mult = 10.0 if args.pretrained else 1.0
    if args.test_batch_size is None:
        args.test_batch_size = args.batch_size
    return args
