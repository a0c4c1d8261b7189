"""Command-line options of the segmentation scripts (PyTorch-Encoding names), with per-dataset defaults.

The one option parser of ``experiments/segmentation``: ``train.py``, ``test.py`` and ``demo.py`` use it, so option
names, defaults and validation are written once. The recipes, the option types and the configurations the options
become live in the library (:mod:`encoding.engine.config`, :mod:`encoding.utils.cli`).
"""
import argparse
import os
import sys
from typing import Any, Dict, List, Optional

from encoding.engine.builders import LOSSES, OPTIMIZERS, STRATEGIES
from encoding.datasets.metadata import resolve_dataset
from encoding.engine.config import (AMP_DTYPES, DIST_TIMEOUT_S, ConfigError, TrainingConfig, check_devices,
                                    check_network, check_split, check_training)
from encoding.engine.recipes import fill_from_recipe, read_recipe
from encoding.utils.cli import (OneLineParser, non_negative_float, non_negative_int, positive_float, positive_int,
                                scales, unit_float)
from encoding.utils.configfile import ConfigFileError, expand_config

SCRIPTS = ("train", "test", "demo")
#: The recipes (``<dataset>.yaml``) and other experiment configurations of ``train.py --config``.
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")

#: Options that define the network; ``test.py`` / ``demo.py`` take them from the checkpoint when not given.
MODEL_OPTIONS = ("dataset", "model", "backbone", "aux", "se_loss", "head_channels", "output_stride", "base_size",
                 "crop_size")

#: PyTorch-Encoding's multi-scale evaluation scales (``--multi-scale``), per dataset.
MULTI_SCALES = {"citys": (0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25)}
DEFAULT_SCALES = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75)


def _add_model_options(p: argparse.ArgumentParser, script: str) -> None:
    """Dataset and network options (``test.py`` / ``demo.py``: ``None`` = from the checkpoint, else the recipe)."""
    p.add_argument("--dataset", default="shapes" if script == "train" else None,
                   help="dataset name (default: the embedded 'shapes'; test/demo: the checkpoint's)")
    if script != "demo":  # demo reads no dataset
        p.add_argument("--data-root", default=None, help="data root (default: $ENCODING_DATA or ~/.encoding/data)")
    p.add_argument("--model", default=None,
                   help="fcn, psp, deeplab, deeplabv3plus, encnet, danet, upernet, fcfpn, unet, segformer")
    p.add_argument("--backbone", default=None,
                   help="resnet18/34/50/101/152, resnext50_32x4d, ..., mobilenet_v3_large/small, vgg_tiny, "
                        "resnest50/101/200/269, timm:<any timm model>, mit_b0..mit_b5 (SegFormer)")
    flag = dict(action="store_true", default=False if script == "train" else None)
    p.add_argument("--aux", help="auxiliary FCN head on the penultimate stage", **flag)
    p.add_argument("--se-loss", help="semantic-encoding loss (EncNet)", **flag)
    p.add_argument("--head-channels", type=positive_int, default=None,
                   help="width of the head (ASPP/decoder channels of deeplab and deeplabv3plus; default: the "
                        "recipe's for its model, else the model's)")
    p.add_argument("--output-stride", type=int, default=None, choices=[8, 16, 32],
                   help="backbone output stride (default: the recipe's; else the model's, 8 for dilated models)")
    p.add_argument("--base-size", type=positive_int, default=None, help="default: the recipe's, else the dataset's")
    p.add_argument("--crop-size", type=positive_int, default=None, help="default: the recipe's, else the dataset's")


def _add_device_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=non_negative_int, default=2)
    p.add_argument("--amp", choices=list(AMP_DTYPES), default="none", help="mixed precision")
    p.add_argument("--no-cuda", action="store_true", help="run on the CPU even when CUDA is available")
    p.add_argument("--device-ids", default=None,
                   help="comma-separated devices for DataParallelModel, e.g. '0,1' or 'cpu,cpu' (default: all GPUs)")
    p.add_argument("--seed", type=int, default=1)


def _add_weight_options(p: argparse.ArgumentParser) -> None:
    """Where ``test.py`` / ``demo.py`` take the weights from (exactly one)."""
    p.add_argument("--resume", default=None, help="checkpoint to evaluate (train.py's model_best.pth / checkpoint.pth)")
    p.add_argument("--model-zoo", default=None, metavar="NAME",
                   help="a preset with published weights: encoding.models.pretrained_model_list(), e.g. fcn_resnet50_voc")
    p.add_argument("--torchvision-weights", action="store_true",
                   help="torchvision's published weights of the whole network: --model fcn/deeplab with --backbone "
                        "resnet50/101")
    p.add_argument("--pretrained", choices=["torchvision"], default=None, help=argparse.SUPPRESS)  # the old spelling


def _add_training_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML/JSON file of options (keys: option names); the command "
                   "line's options win; a run saves its own as config.yaml (docs/configs.md)")
    p.add_argument("--tensorboard", action="store_true", help="TensorBoard scalars and previews in the run directory")
    p.add_argument("--wandb", action="store_true", help="log to an offline Weights & Biases run in the run directory")
    p.add_argument("--log-images", type=non_negative_int, default=5, metavar="N",
                   help="with --tensorboard/--wandb: validation previews every N epochs and after the last (0: none)")
    p.add_argument("--pretrained-backbone", "--pretrained", dest="pretrained", nargs="?", const=True, default=False,
                   metavar="FILE", help="start the backbone from ImageNet weights (torchvision's, or FILE: e.g. "
                   "nvidia/mit-b0's model.safetensors for mit_b*); the network's other layers start fresh")
    p.add_argument("--aux-weight", type=non_negative_float, default=0.2, help="weight of the auxiliary loss (PE train.py: 0.2)")
    p.add_argument("--se-weight", type=non_negative_float, default=0.2)
    p.add_argument("--loss", choices=list(LOSSES), default="ce", help="the pixel loss (docs/nn.md); aux/SE terms as for ce")
    p.add_argument("--class-weights", default=None, metavar="auto|median|FILE",
                   help="auto: ENet's 1/ln(1.02+p_c) from the training labels (cached); median: median frequency; FILE: numbers")
    p.add_argument("--scale-range", type=scales, default=None, metavar="MIN,MAX",
                   help="relative range of the training long side around --base-size (default: the recipe's, else "
                        "the dataset's, 0.5,2.0 for the real datasets)")
    p.add_argument("--train-split", default="train")
    p.add_argument("--val-split", default="val")
    p.add_argument("--epochs", type=positive_int, default=None)
    p.add_argument("--start-epoch", type=non_negative_int, default=0)
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="total batch over all devices (per process in DDP)")
    p.add_argument("--test-batch-size", type=positive_int, default=None)
    p.add_argument("--lr", type=positive_float, default=None, help="default: the recipe's, scaled linearly with --batch-size")
    p.add_argument("--lr-scheduler", default="poly", choices=["poly", "cos", "step"])
    p.add_argument("--lr-step", type=non_negative_int, default=0)
    p.add_argument("--warmup-epochs", type=non_negative_int, default=0)
    p.add_argument("--head-lr-mult", type=positive_float, default=None,
                   help="learning-rate factor of the heads (default: 10 with --pretrained-backbone, as in PE; else 1)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None,
                   help="sgd (PyTorch-Encoding's, momentum + weight decay) or adamw (default: the recipe's)")
    p.add_argument("--momentum", type=non_negative_float, default=0.9)
    p.add_argument("--weight-decay", type=non_negative_float, default=None, help="default: the recipe's (1e-4)")
    p.add_argument("--checkpoint", choices=["none", "backbone", "all"], default="none",
                   help="activation checkpointing (recompute in backward, exact): every residual block, or blocks "
                        "and heads; about half the peak memory of FCN-ResNet50 for one extra forward per step "
                        "(docs/checkpointing.md)")
    p.add_argument("--clip-grad", type=positive_float, default=None, help="clip the global gradient norm")
    p.add_argument("--dist-timeout", type=positive_float, default=DIST_TIMEOUT_S, metavar="SECONDS",
                   help="under torchrun: end the job when a collective waits this long (a frozen or lost rank)")
    p.add_argument("--strategy", choices=STRATEGIES, default="ddp", help="under torchrun: ddp, fsdp (FSDP2 fully_shard)"
                   " or zero1 (DDP + ZeroRedundancyOptimizer); docs/training.md, 'Sharded training'")
    p.add_argument("--balance", choices=["none", "memory"], default="none",
                   help="memory: per-device split sizes chosen by the memory simulator to unload device 0")
    p.add_argument("--resume", default=None, help="checkpoint to resume from")
    p.add_argument("--ft", action="store_true", help="fine-tune: load weights only, restart epochs/optimizer")
    p.add_argument("--checkname", default="default", help="run name under runs/<dataset>/<model>/")
    p.add_argument("--output-dir", default="runs")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run already in runs/<dataset>/<model>/<checkname> (default: refuse it)")
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
    _add_data_options(p)


def _add_data_options(p: argparse.ArgumentParser) -> None:
    """Own data (``--dataset folder``) and binary segmentation (docs/own-data.md)."""
    p.add_argument("--val-fraction", type=positive_float, default=0.1, help="folder without val: hold-out share")
    p.add_argument("--unknown-labels", choices=["error", "ignore"], default="error", help="values of no class")
    p.add_argument("--binary", action="store_true", help="one foreground channel (masks with two values)")
    p.add_argument("--binary-class", default=None, metavar="NAME", help="binary: class NAME against the rest")
    p.add_argument("--threshold", type=positive_float, default=0.5, help="binary: foreground probability threshold")


def _add_test_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--split", default="val", help="split to evaluate (test: predictions only, no masks)")
    p.add_argument("--mode", default=None, choices=["val", "testval", "test", "slide"],
                   help="val: resized centre crops, batched, as validated during training (default); testval: whole "
                        "images (default with --multi-scale); test: predict only (default for the test split); slide: "
                        "whole images by overlapping windows (mmsegmentation's; testval, or test on the test split)")
    p.add_argument("--window", type=positive_int, default=None, help="--mode slide window (default: --crop-size)")
    p.add_argument("--stride", type=positive_int, default=None, help="--mode slide stride (default: 2/3 of --window)")
    _add_multi_scale_options(p)
    p.add_argument("--test-batch-size", type=positive_int, default=None, help="default: 16 (val mode)")
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N samples")
    p.add_argument("--save-pred", default=None, metavar="DIR",
                   help="write each whole-image prediction as a coloured PNG (dataset palette) named after its input "
                        "file, at its size (default mode with it: testval)")
    p.add_argument("--out-dir", default=None,
                   help="where metrics.json goes (default: the checkpoint's folder, else runs/<dataset>/<model>/eval)")


def _add_demo_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("images", nargs="+", metavar="IMAGE", help="JPEG/PNG images (any size; grey/RGBA converted)")
    p.add_argument("--out-dir", default="demo", help="where the mask and overlay PNGs go (default: demo)")
    p.add_argument("--overwrite", action="store_true", help="replace outputs that exist (default: refuse)")
    p.add_argument("--alpha", type=unit_float, default=0.5, help="weight of the mask in the overlay, 0..1 (default: 0.5)")
    p.add_argument("--blend-background", action="store_true", help="blend the background class too (default: not)")
    _add_multi_scale_options(p)


def _add_multi_scale_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--multi-scale", action="store_true",
                   help="average over scales and flips with sliding windows (MultiEvalModule)")
    p.add_argument("--scales", type=scales, default=None,
                   help="comma-separated scales for --multi-scale (default: PyTorch-Encoding's for the dataset)")


def build_parser(script: str = "train") -> argparse.ArgumentParser:
    """The argument parser of ``experiments/segmentation/<script>.py`` (``train``, ``test`` or ``demo``)."""
    if script not in SCRIPTS:
        raise ValueError(f"unknown script {script!r}; valid: {', '.join(SCRIPTS)}")
    titles = {"train": "Train / evaluate a segmentation model (encoding)",
              "test": "Evaluate a segmentation model on a dataset split (encoding)",
              "demo": "Segment images: coloured mask and overlay PNGs (encoding)"}
    p = OneLineParser(prog=f"{script}.py", description=titles[script])
    if script == "demo":
        _add_demo_options(p)
    _add_model_options(p, script)
    if script == "demo":  # one device, no loader: only --no-cuda of the device options
        p.add_argument("--no-cuda", action="store_true", help="run on the CPU even when CUDA is available")
    else:
        _add_device_options(p)
    if script == "train":
        _add_training_options(p)
    else:
        _add_weight_options(p)
    if script == "test":
        _add_test_options(p)
    return p


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse option combinations that cannot work, before any work is done (one-line error, exit status 2)."""
    if args.eval and not args.resume:
        parser.error("--eval evaluates a checkpoint: pass --resume <checkpoint.pth>")
    if args.resume and not os.path.isfile(args.resume):
        parser.error(f"argument --resume: no such file: {args.resume}")
    if args.start_epoch >= args.epochs:
        parser.error(f"--start-epoch {args.start_epoch} must be below --epochs {args.epochs}")
    try:  # every value the run cannot use, before any directory or data is made
        check_training(TrainingConfig(**vars(args)))
    except ConfigError as err:
        parser.error(str(err))
    from encoding.datasets import datasets
    dataset = datasets.get(args.dataset.lower())
    base = args.base_size or getattr(dataset, "BASE_SIZE", None)
    crop = args.crop_size or getattr(dataset, "CROP_SIZE", None)
    if base is not None and crop is not None and crop > base:
        sys.stderr.write(f"warning: --crop-size {crop} is larger than --base-size {base}: training images are "
                         "scaled around the base size, so most of each crop will be padding\n")


def parse_args(argv: Optional[List[str]] = None, script: str = "train") -> argparse.Namespace:
    """Parse ``argv`` for ``script``, fill unset options (checkpoint, then dataset recipe) and check the combination
    (exit status 2 with a one-line error)."""
    parser = build_parser(script)
    args = parser.parse_args(_with_config(parser, argv) if script == "train" else argv)
    if script != "train":
        return _parse_inference(parser, args, script)
    del args.config
    try:
        fill_from_recipe(args, ("epochs", "batch_size", "model", "backbone", "output_stride", "base_size",
                                "crop_size", "scale_range", "optimizer", "weight_decay", "lr"), _recipe)
    except ConfigError as err:
        parser.error(str(err))
    if args.scale_range is not None and (len(args.scale_range) != 2 or args.scale_range[0] > args.scale_range[1]):
        parser.error(f"argument --scale-range: expected MIN,MAX with MIN <= MAX, got {args.scale_range}")
    if args.head_lr_mult is None:
        args.head_lr_mult = 10.0 if args.pretrained else 1.0
    if args.test_batch_size is None:
        args.test_batch_size = args.batch_size
    _check(parser, args)
    return args


def _with_config(parser: argparse.ArgumentParser, argv: Optional[List[str]]) -> List[str]:
    """``argv`` with the options of its ``--config FILE`` first: the command line's, after them, win."""
    try:
        return expand_config(parser, sys.argv[1:] if argv is None else argv)
    except ConfigFileError as err:
        parser.error(str(err))


def _recipe(dataset: str) -> Dict[str, Any]:
    """The recipe of ``dataset``: ``configs/<dataset>.yaml`` typed by train.py's parser, else the built-in values."""
    return read_recipe(build_parser("train"), CONFIGS, dataset)


def _parse_inference(parser: argparse.ArgumentParser, args: argparse.Namespace, script: str) -> argparse.Namespace:
    """``test.py`` / ``demo.py``: one source of weights; the network's options from it, then from the recipe."""
    args.torchvision_weights = args.torchvision_weights or args.pretrained == "torchvision"
    sources = [flag for flag, value in (("--resume", args.resume), ("--model-zoo", args.model_zoo),
                                        ("--torchvision-weights", args.torchvision_weights)) if value]
    if len(sources) != 1:
        parser.error("pass exactly one of --resume <checkpoint.pth>, --model-zoo NAME or --torchvision-weights"
                     + (f" (got {', '.join(sources)})" if sources else ""))
    if args.resume and not os.path.isfile(args.resume):
        parser.error(f"argument --resume: no such file: {args.resume}")
    try:
        saved = _saved_model_options(args)
    except (ValueError, OSError) as err:
        parser.error(str(err).splitlines()[0])
    for name in MODEL_OPTIONS + ("data_root",):  # a folder dataset's root comes with its checkpoint
        if getattr(args, name, False) is None and saved.get(name) is not None:
            setattr(args, name, saved[name])
    try:  # a user's dataset class, imported from the path its checkpoint recorded
        _ = saved.get("dataset") == args.dataset and resolve_dataset(args.dataset, saved.get("dataset_class"))
    except ValueError as err:
        parser.error(str(err))
    args.dataset = args.dataset or "shapes"
    if args.torchvision_weights and args.model is None:
        args.model, args.backbone = "fcn", args.backbone or "resnet50"
    fill_from_recipe(args, ("model", "backbone", "output_stride", "base_size", "crop_size"), _recipe)
    args.aux, args.se_loss = bool(args.aux), bool(args.se_loss)
    if args.scales is None:
        args.scales = MULTI_SCALES.get(args.dataset, DEFAULT_SCALES)
    if script == "test":
        slide = args.mode == "slide"
        if slide and args.multi_scale or (args.window or args.stride) and not slide:
            parser.error("--mode slide is single-scale, without --multi-scale" if slide else "--window / --stride "
                         "are options of --mode slide")
        if args.mode in (None, "slide"):
            args.mode = "test" if args.split == "test" else "testval" if args.multi_scale or args.save_pred or slide \
                else "val"
        args.inference, args.window = "slide" if slide else "whole", args.window or (args.crop_size if slide else None)
        args.stride = args.stride or (max(args.window * 2 // 3, 1) if slide else None)
        if args.mode == "val" and (args.multi_scale or args.save_pred):
            parser.error(f"{'--multi-scale' if args.multi_scale else '--save-pred'} works on whole images: use "
                         "--mode testval (its default) or --mode test")
        args.test_batch_size = args.test_batch_size or 16
    try:
        if not args.model_zoo:
            check_network(args.dataset, args.model, args.backbone, aux=args.aux, se_loss=args.se_loss,
                          output_stride=args.output_stride, head_channels=args.head_channels)
        if script == "test":
            check_split(args.dataset, args.split, "--split", masks=args.mode != "test")
        check_devices(getattr(args, "device_ids", None))
    except ConfigError as err:
        parser.error(str(err))
    return args


def _saved_model_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The network options recorded with the weights: a checkpoint's training options, or a zoo preset's."""
    if args.model_zoo:
        from encoding.models.registry import PRESETS
        from encoding.models import model_list
        if args.model_zoo.lower() not in PRESETS:
            raise ValueError(f"argument --model-zoo: unknown name {args.model_zoo!r}; e.g. "
                             f"{', '.join(model_list[:4])}, ... (encoding.models.model_list)")
        preset = PRESETS[args.model_zoo.lower()]
        return {"dataset": preset["dataset"], "model": preset["name"], "backbone": preset["backbone"],
                "aux": preset["aux"], "se_loss": preset["se_loss"]}
    if args.resume:
        from encoding.engine.state import saved_options
        return saved_options(args.resume, MODEL_OPTIONS + ("data_root", "dataset_class"))
    return {}
