"""Command-line options of the segmentation scripts (PyTorch-Encoding names), with per-dataset defaults.

The one option parser of ``experiments/segmentation``: ``train.py`` uses it, and so do the other scripts of this
folder, so option names, defaults and validation are written once.
"""
import argparse
import os
import sys
from typing import Any, Callable, List, NoReturn, Optional

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


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``prog: error: ...``, exit status 2), without the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _number(kind: Callable[[str], Any], minimum: Any, inclusive: bool) -> Callable[[str], Any]:
    """An argparse ``type`` accepting ``kind`` values ``> minimum`` (``>=`` when ``inclusive``)."""
    bound = f">= {minimum}" if inclusive else f"> {minimum}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not (value >= minimum if inclusive else value > minimum) or value != value:  # value != value: NaN
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


positive_int, positive_float = _number(int, 0, False), _number(float, 0.0, False)
non_negative_int, non_negative_float = _number(int, 0, True), _number(float, 0.0, True)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the segmentation scripts."""
    p = OneLineParser(description="Train / evaluate a segmentation model (encoding)")
    p.add_argument("--dataset", default="shapes", help="dataset name (default: the embedded 'shapes')")
    p.add_argument("--data-root", default=None, help="data root (default: $ENCODING_DATA or ~/.encoding/data)")
    p.add_argument("--model", default=None, help="fcn, psp, deeplab, encnet, danet, upernet, fcfpn")
    p.add_argument("--backbone", default=None, help="resnet18/34/50/101/152, resnext50_32x4d, ...")
    p.add_argument("--pretrained", action="store_true", help="start the backbone from ImageNet weights")
    p.add_argument("--aux", action="store_true", help="auxiliary FCN head on the penultimate stage")
    p.add_argument("--aux-weight", type=non_negative_float, default=0.2, help="weight of the auxiliary loss (PE train.py: 0.2)")
    p.add_argument("--se-loss", action="store_true", help="semantic-encoding loss (EncNet)")
    p.add_argument("--se-weight", type=non_negative_float, default=0.2)
    p.add_argument("--base-size", type=positive_int, default=None, help="default: the dataset's")
    p.add_argument("--crop-size", type=positive_int, default=None, help="default: the dataset's")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument("--workers", type=non_negative_int, default=2)
    p.add_argument("--epochs", type=positive_int, default=None)
    p.add_argument("--start-epoch", type=non_negative_int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="total batch over all devices (per process in DDP)")
    p.add_argument("--test-batch-size", type=positive_int, default=None)
    p.add_argument("--lr", type=positive_float, default=None, help="default: the recipe's, scaled by batch/16")
    p.add_argument("--lr-scheduler", default="poly", choices=["poly", "cos", "step"])
    p.add_argument("--lr-step", type=non_negative_int, default=0)
    p.add_argument("--warmup-epochs", type=non_negative_int, default=0)
    p.add_argument("--head-lr-mult", type=positive_float, default=None,
                   help="learning-rate factor of the heads (default: 10 with --pretrained, as in PE; else 1)")
    p.add_argument("--output-stride", type=int, default=None, choices=[8, 16, 32],
                   help="backbone output stride (default: the recipe's; else the model's, 8 for dilated models)")
    p.add_argument("--momentum", type=non_negative_float, default=0.9)
    p.add_argument("--weight-decay", type=non_negative_float, default=1e-4)
    p.add_argument("--amp", choices=list(AMP_DTYPES), default="none", help="mixed precision")
    p.add_argument("--checkpoint", choices=["none", "backbone", "all"], default="none",
                   help="activation checkpointing (recompute in backward, exact): every residual block, or blocks "
                        "and heads; about half the peak memory of FCN-ResNet50 for one extra forward per step "
                        "(docs/checkpointing.md)")
    p.add_argument("--clip-grad", type=positive_float, default=None, help="clip the global gradient norm")
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
    p.add_argument("--train-limit", type=positive_int, default=None, help="use only the first N training samples")
    p.add_argument("--val-limit", type=positive_int, default=None, help="use only the first N validation samples")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (torch.use_deterministic_algorithms): bitwise-reproducible runs")
    p.add_argument("--verify-data", action="store_true",
                   help="read every sample once before training and stop at the first bad file (with --skip-bad: "
                        "drop the bad ones)")
    p.add_argument("--skip-bad", action="store_true",
                   help="skip unreadable or inconsistent samples with a warning instead of stopping")
    return p


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse option combinations that cannot work, before any work is done (one-line error, exit status 2)."""
    if args.eval and not args.resume:
        parser.error("--eval evaluates a checkpoint: pass --resume <checkpoint.pth>")
    if args.resume and not os.path.isfile(args.resume):
        parser.error(f"argument --resume: no such file: {args.resume}")
    if args.start_epoch >= args.epochs:
        parser.error(f"--start-epoch {args.start_epoch} must be below --epochs {args.epochs}")
    from encoding.datasets import datasets
    dataset = datasets.get(args.dataset.lower())
    base = args.base_size or getattr(dataset, "BASE_SIZE", None)
    crop = args.crop_size or getattr(dataset, "CROP_SIZE", None)
    if base is not None and crop is not None and crop > base:
        sys.stderr.write(f"warning: --crop-size {crop} is larger than --base-size {base}: training images are "
                         "scaled around the base size, so most of each crop will be padding\n")


def parse_device_ids(text: Optional[str]) -> Optional[List[Any]]:
    """``"0,1"`` -> ``[0, 1]``; ``"cpu,cpu"`` -> ``["cpu", "cpu"]``; ``None``/``""`` -> ``None`` (the default)."""
    if not text:
        return None
    return [int(item) if item.strip().isdigit() else item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parse ``argv``, fill unset options from the dataset recipe and check the combination (exit 2 on errors)."""
    parser = build_parser()
    args = parser.parse_args(argv)
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
    _check(parser, args)
    return args
