"""The options of a run, in groups: the network, the data, the optimisation, the devices and the run itself, plus
what ``test.py`` / ``demo.py`` add (where the weights come from, how to evaluate, what the demo draws).

Each field is one option (:func:`~.fields.option`): its default is the library's, the built-in run (a U-Net on
``vgg_tiny_s2`` learning the embedded ``shapes`` dataset on a CPU in minutes; the recipe file ``shapes.yaml`` says the
same and a test keeps them equal). Adding an option is adding a field here: the parsers, the configuration files,
:class:`~encoding.engine.assemble.TrainingConfig` and ``config.yaml`` follow.

Defaults that differ between layers on purpose (PyTorch-Encoding's own split), stated here once:
    * ``aux_weight``: ``0.2`` here (PE's ``train.py``), ``0.4`` in :func:`encoding.engine.builders.build_criterion` and
      :class:`encoding.nn.SegmentationLosses` (PE's library default): :data:`AUX_WEIGHT_LIBRARY`;
    * ``head_lr_mult``: ``1`` here, ``10`` with ``--pretrained-backbone`` (:func:`~.resolve.resolve`'s rule), and
      ``10`` in :class:`encoding.utils.lr_scheduler.IterationLR` (PE's scheduler default).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch

from ..nn.loss import LOSSES
from ..names import absolute_spec
from ..nn.recompute import RECOMPUTE_POLICIES
from ..registry import Registry
from ..utils.cli import non_negative_float, non_negative_int, positive_float, positive_int, scales, unit_float
from ..utils.optim import OPTIMIZERS
from .fields import ALL, EVAL, option

__all__ = ["BUILTIN_SIZES", "AMP_CHOICES", "AMP_DTYPES", "COMPILE_CHOICES", "OPTIMIZERS", "STRATEGIES", "RECOMPUTE_POLICIES",
           "DIST_TIMEOUT_S", "AUX_WEIGHT_LIBRARY",
           "ModelOptions", "DataOptions", "OptimOptions", "DeviceOptions", "RunOptions", "WeightOptions",
           "EvalOptions", "DemoOptions", "GROUPS"]

#: ``--amp``: full precision, bfloat16 or float16 autocast.
AMP_CHOICES = ("none", "bf16", "fp16")
#: ``--amp`` -> the autocast dtype (``None``: full precision); the one table of training, evaluation and the memory
#: tool.
AMP_DTYPES = dict(zip(AMP_CHOICES, (None, torch.bfloat16, torch.float16)))
#: ``--strategy`` under torchrun (``encoding.engine.builders.wrap_model(strategy=...)``): name -> what wraps the model.
STRATEGIES: Registry[str] = Registry("strategy", {"ddp": "DistributedDataParallel",
                                                  "fsdp": "FSDP2 fully_shard",
                                                  "zero1": "DistributedDataParallel + ZeroRedundancyOptimizer"})
#: ``--compile``: eager, ``auto`` (a bare ``--compile``: CUDA graphs on one CUDA device per process, else inductor's
#: default) or a ``torch.compile`` mode (``encoding.engine.compiled``).
COMPILE_CHOICES = ("none", "auto", "default", "reduce-overhead", "max-autotune")
#: ``--recompute``: activation recomputation (``encoding.nn.recompute``) of nothing, every residual block, or
#: blocks and heads.
#: ``--dist-timeout``: a collective waiting this long ends a torchrun job (torch's gloo default: 30 minutes). The
#: longest legitimate wait between two collectives is rank 0 writing the checkpoint and the best model (about 1 GB
#: for the largest recipes: tens of seconds on a slow shared disk), so 10 minutes leaves ten times that and is
#: torch's own NCCL default.
DIST_TIMEOUT_S = 600.0
#: The image sizes of the built-in run (``shapes``, its recipe ``shapes.yaml`` too), where the fields (and
#: :class:`~encoding.engine.assemble.TrainingConfig`) leave them ``None`` (another dataset's ``None`` sizes are its own
#: ``BASE_SIZE`` / ``CROP_SIZE`` / ``SCALE_RANGE``).
BUILTIN_SIZES = {"base_size": 72, "crop_size": 64, "scale_range": (1.0, 1.0)}
#: The auxiliary loss weight of :func:`encoding.engine.builders.build_criterion` and ``SegmentationLosses`` (PE's library
#: default); ``train.py`` uses :attr:`OptimOptions.aux_weight` (PE's ``train.py``: 0.2).
AUX_WEIGHT_LIBRARY = 0.4

TRAIN = ("train",)
#: The fields the memory tool shares with the scripts (``memory``) and export's (``export``).
WITH_MEMORY = ALL + ("memory",)


def model_name(text: str) -> str:
    """``--model``: a name as given; a relative ``transformers:PATH`` made absolute (a checkpoint records it, and
    is used from other folders)."""
    return absolute_spec(text)


def memory(**spelling: object) -> dict:
    """``per_script`` of a field the memory tool spells with its own default or help."""
    return {"memory": spelling}


@dataclass(frozen=True)
class ModelOptions:
    """The network (``test.py`` / ``demo.py``: unset = the checkpoint's, else the recipe's)."""

    model: str = option("unet", "fcn, psp, deeplab, deeplabv3plus, encnet, danet, upernet, fcfpn, unet, segformer "
                        "(default: the recipe's)", parse=model_name, network=True, recipe=True, scripts=WITH_MEMORY,
                        per_script=memory(default="fcn", help="segmentation model (default: fcn)"))
    backbone: str = option("vgg_tiny_s2", "resnet18/34/50/101/152, resnext50_32x4d, ..., mobilenet_v3_large/small, "
                           "vgg_tiny(_s2), resnest50/101/200/269, timm:<any timm model>, mit_b0..mit_b5 (SegFormer)",
                           network=True, recipe=True, scripts=WITH_MEMORY,
                           per_script=memory(default="resnet50", help="backbone (default: resnet50)"))
    aux: bool = option(False, "auxiliary FCN head on the penultimate stage", network=True, scripts=WITH_MEMORY)
    se_loss: bool = option(False, "semantic-encoding loss (EncNet)", network=True, scripts=WITH_MEMORY)
    head_channels: Optional[int] = option(None, "width of the head (ASPP/decoder channels of deeplab and "
                                          "deeplabv3plus; default: the recipe's for its model, else the model's)",
                                          parse=positive_int, network=True, recipe=True, scripts=WITH_MEMORY,
                                          per_script=memory(default=None, help="width of the head (ASPP/decoder "
                                                            "channels of deeplab and deeplabv3plus; default: the "
                                                            "model's)"))
    output_stride: Optional[int] = option(8, "backbone output stride (default: the recipe's for its model; else "
                                          "the model's, 8 for dilated models)", parse=int, choices=(8, 16, 32),
                                          network=True, recipe=True, scripts=WITH_MEMORY,
                                          per_script=memory(default=None, help="backbone output stride (default: "
                                                            "the model's, 8 for dilated models)"))
    pretrained: Union[bool, str] = option(
        False, "start the backbone from ImageNet weights (torchvision's, or FILE: e.g. nvidia/mit-b0's "
        "model.safetensors for mit_b*); the network's other layers start fresh",
        flags=("--pretrained-backbone", "--pretrained"), nargs="?", const=True, metavar="FILE",
        per_script={s: dict(flags=("--pretrained",), choices=["torchvision"], nargs=None, const=None,
                            metavar=None, default=None, help=argparse.SUPPRESS) for s in EVAL})
    recompute: str = option("none", "activation recomputation (in backward, exact): every residual block, or blocks "
                            "and heads; about half the peak memory of FCN-ResNet50 for one extra forward per step "
                            "(docs/checkpointing.md)", choices=RECOMPUTE_POLICIES, old="--checkpoint", scripts=("train", "memory"),
                            per_script=memory(help="activation recomputation of the model (every residual block, or "
                                              "blocks and heads); when simulating, the report adds each device's peak "
                                              "without it and the saving"))


@dataclass(frozen=True)
class DataOptions:
    """The dataset, its splits, the image sizes and the loading."""

    dataset: str = option("shapes", "dataset name (default: the embedded 'shapes'; test/demo: the checkpoint's)",
                          network=True, scripts=WITH_MEMORY, per_script=memory(
                              default="pascal_voc", help="gives the class count and the default crop"))
    data_root: Optional[str] = option(None, "data root (default: $ENCODING_DATA or ~/.encoding/data)",
                                      scripts=("train", "test", "memory"), per_script=memory(
                                          help="--dataset folder: its folder (its classes give the class count)"))
    base_size: Optional[int] = option(None, "default: the recipe's, else the dataset's", parse=positive_int,
                                      network=True, recipe=True)
    crop_size: Optional[int] = option(None, "default: the recipe's, else the dataset's", parse=positive_int,
                                      network=True, recipe=True, scripts=WITH_MEMORY,
                                      per_script=memory(help="square crop in pixels (default: the dataset's)"))
    scale_range: Optional[Tuple[float, float]] = option(
        None, "relative range of the training long side around --base-size (default: the recipe's, else the "
        "dataset's, 0.5,2.0 for the real datasets)", parse=scales, metavar="MIN,MAX", recipe=True, scripts=TRAIN)
    train_split: str = option("train", "the split to train on", scripts=TRAIN)
    val_split: str = option("val", "the split to validate on", scripts=TRAIN)
    train_limit: Optional[int] = option(None, "use only the first N training samples", parse=positive_int,
                                        scripts=TRAIN)
    val_limit: Optional[int] = option(None, "use only the first N validation samples", parse=positive_int,
                                      scripts=TRAIN)
    workers: int = option(2, "data loading processes (default: 2; 0 for a CPU run on at most 2 cores)",
                          parse=non_negative_int, scripts=("train", "test"))
    verify_data: bool = option(False, "read every sample once before training and stop at the first bad file (with "
                               "--skip-bad: drop the bad ones)", scripts=TRAIN)
    skip_bad: bool = option(False, "skip unreadable or inconsistent samples with a warning instead of stopping",
                            scripts=TRAIN)
    max_pixels: Optional[int] = option(
        None, "refuse an image or mask of more pixels, read from its header before decoding (default: "
        "$ENCODING_MAX_PIXELS or 100000000)", parse=positive_int, metavar="N", recorded=False,
        scripts=TRAIN + ("app",), per_script={"app": dict(help="refuse an uploaded image of more pixels, read from its "
                                                               "header before decoding (default: $ENCODING_MAX_PIXELS "
                                                               "or 100000000)")})
    # own data and binary segmentation (docs/own-data.md)
    val_fraction: float = option(0.1, "folder without val: hold-out share", parse=positive_float, scripts=TRAIN)
    unknown_labels: str = option("error", "values of no class", choices=("error", "ignore"), scripts=TRAIN)
    binary: bool = option(False, "one foreground channel (masks with two values)", scripts=TRAIN)
    binary_class: Optional[str] = option(None, "binary: class NAME against the rest", metavar="NAME", scripts=TRAIN)
    threshold: float = option(0.5, "binary: foreground probability threshold", parse=positive_float, scripts=TRAIN)


@dataclass(frozen=True)
class OptimOptions:
    """The loss, the schedule and the optimizer."""

    loss: str = option("ce", "the pixel loss (docs/nn.md); aux/SE terms as for ce", choices=tuple(LOSSES),
                       scripts=("train", "memory"))
    aux_weight: float = option(0.2, "weight of the auxiliary loss (PE train.py: 0.2; build_criterion's default, PE's "
                               "library one: 0.4)", parse=non_negative_float, scripts=TRAIN)
    se_weight: float = option(0.2, "weight of the semantic-encoding loss", parse=non_negative_float, scripts=TRAIN)
    class_weights: Optional[str] = option(None, "auto: ENet's 1/ln(1.02+p_c) from the training labels (cached); "
                                          "median: median frequency; FILE: numbers", metavar="auto|median|FILE",
                                          scripts=TRAIN)
    epochs: int = option(8, "training epochs (default: the recipe's)", parse=positive_int, recipe=True,
                         scripts=TRAIN)
    start_epoch: int = option(0, "the first epoch's number", parse=non_negative_int, scripts=TRAIN)
    batch_size: int = option(16, "total batch over all devices (per process in DDP; default: the recipe's)",
                             parse=positive_int, recipe=True, scripts=("train", "memory"),
                             per_script=memory(default=None, help="total batch (default: 2 per device)"))
    test_batch_size: Optional[int] = option(None, "validation batch (default: --batch-size)", parse=positive_int,
                                            scripts=("train", "test"),
                                            per_script={"test": dict(help="default: 16 (val mode)")})
    lr: float = option(0.006, "default: the recipe's, scaled linearly with --batch-size (x the torchrun processes)",
                       parse=positive_float, recipe=True, scripts=TRAIN)
    lr_scheduler: str = option("poly", "the learning-rate schedule", choices=("poly", "cos", "step"), scripts=TRAIN)
    lr_step: int = option(0, "epochs between two x0.1 decays (--lr-scheduler step)", parse=non_negative_int,
                          scripts=TRAIN)
    warmup_epochs: float = option(1, "linear warm-up epochs, a fraction too (e.g. 0.5); default: the recipe's, "
                                  "else none", parse=non_negative_float, recipe=True, scripts=TRAIN)
    head_lr_mult: float = option(1.0, "learning-rate factor of the heads (default: 10 with --pretrained-backbone, "
                                 "as in PE; else 1)", parse=positive_float, scripts=TRAIN)
    optimizer: str = option("adamw", "sgd (PyTorch-Encoding's, momentum + weight decay) or adamw (default: the "
                            "recipe's)", choices=OPTIMIZERS, recipe=True, scripts=("train", "memory"),
                            per_script=memory(default="sgd", help="the optimizer whose state the step holds: sgd "
                                              "(--momentum; default: every recipe's but shapes' and folder's) or "
                                              "adamw (two states per parameter)"))
    momentum: float = option(0.9, "SGD momentum (0: SGD holds no state)", parse=non_negative_float,
                             scripts=("train", "memory"))
    weight_decay: float = option(1e-4, "default: the recipe's (1e-4)", parse=non_negative_float, recipe=True,
                                 scripts=("train", "memory"),
                                 per_script=memory(help="weight decay (default: 1e-4; 0: none)"))
    clip_grad: Optional[float] = option(None, "clip the global gradient norm", parse=positive_float, scripts=TRAIN)


@dataclass(frozen=True)
class DeviceOptions:
    """Where and how the run computes."""

    no_cuda: bool = option(False, "run on the CPU even when CUDA is available")
    device_ids: Optional[str] = option(None, "comma-separated devices for DataParallelModel, e.g. '0,1' or "
                                       "'cpu,cpu' (default: all GPUs)", scripts=("train", "test"))
    amp: str = option("none", "mixed precision", choices=AMP_CHOICES, scripts=("train", "test", "memory"),
                      per_script=memory(nargs="?", const="auto", choices=("auto",) + AMP_CHOICES[1:], default=None,
                                        help="mixed precision: bf16 or fp16 autocast (a bare --amp: bf16 when "
                                        "simulating, fp16 on GPUs)"))
    compile: str = option("none", "torch.compile the network (a bare --compile: auto, CUDA graphs on one GPU per "
                          "process, else inductor; C++ kernels on a CPU); eager, with one line saying why, where it "
                          "cannot", choices=COMPILE_CHOICES, nargs="?", const="auto", scripts=("train", "test"))
    seed: int = option(1, "random seed", parse=int, scripts=("train", "memory"),
                       per_script=memory(default=0))
    deterministic: bool = option(False, "deterministic kernels (torch.use_deterministic_algorithms): "
                                 "bitwise-reproducible runs", scripts=TRAIN)
    dist_timeout: float = option(DIST_TIMEOUT_S, "under torchrun: end the job when a collective waits this long (a "
                                 "frozen or lost rank)", parse=positive_float, metavar="SECONDS", scripts=TRAIN)
    strategy: str = option("ddp", "under torchrun: ddp, fsdp (FSDP2 fully_shard) or zero1 (DDP + "
                           "ZeroRedundancyOptimizer); docs/training.md, 'Sharded training'", choices=STRATEGIES,
                           scripts=TRAIN)
    balance: str = option("none", "memory: per-device split sizes chosen by the memory simulator to unload "
                          "device 0", choices=("none", "memory"), scripts=TRAIN)


@dataclass(frozen=True)
class RunOptions:
    """The run directory, resuming and what the run logs."""

    resume: Optional[str] = option(None, "checkpoint to resume from", recorded=False, scripts=ALL + ("export", "app"),
                                   per_script={**{s: dict(help="checkpoint to evaluate (train.py's model_best.pth / "
                                                          "checkpoint.pth)") for s in EVAL},
                                               "app": dict(metavar="CKPT", help="train.py's checkpoint to segment "
                                                           "with (model_best.pth / checkpoint.pth)"),
                                               "export": dict(required=True, metavar="PATH", help="train.py's "
                                                              "checkpoint (model_best.pth / checkpoint.pth) or a "
                                                              "preset name of model_list")})
    ft: bool = option(False, "fine-tune: load weights only, restart epochs/optimizer", scripts=TRAIN)
    checkname: str = option("default", "run name under runs/<dataset>/<model>/", scripts=TRAIN)
    output_dir: str = option("runs", "where the runs go", scripts=TRAIN)
    overwrite: bool = option(False, "replace the run already in runs/<dataset>/<model>/<checkname> (default: refuse "
                             "it)", recorded=False, scripts=("train", "demo"),
                             per_script={"demo": dict(help="replace outputs that exist (default: refuse)")})
    eval: bool = option(False, "only evaluate (with --resume)", recorded=False, scripts=TRAIN)
    no_val: bool = option(False, "skip validation after each epoch", scripts=TRAIN)
    tensorboard: bool = option(False, "TensorBoard scalars and previews in the run directory", scripts=TRAIN)
    wandb: bool = option(False, "log to an offline Weights & Biases run in the run directory", scripts=TRAIN)
    log_images: int = option(5, "with --tensorboard/--wandb: validation previews every N epochs and after the last "
                             "(0: none)", parse=non_negative_int, metavar="N", scripts=TRAIN)


@dataclass(frozen=True)
class WeightOptions:
    """Where ``test.py`` / ``demo.py`` take the weights from, besides ``--resume`` (exactly one)."""

    model_zoo: Optional[str] = option(None, "a preset with published weights: encoding.models.pretrained_model_list(),"
                                      " e.g. fcn_resnet50_voc", metavar="NAME", scripts=EVAL)
    torchvision_weights: bool = option(False, "torchvision's published weights of the whole network: --model "
                                       "fcn/deeplab with --backbone resnet50/101", scripts=EVAL)
    trust_code: bool = option(False, "import and run the code the checkpoint's network names (a module:factory "
                              "model, a dataset class of its author's); without it such a checkpoint is refused "
                              "(docs/sharing.md, 'Trust')", recorded=False,
                              scripts=EVAL + ("export", "app", "train"),
                              per_script={"app": dict(help="import and run the code the --model folder or --resume "
                                                      "checkpoint names (a module:factory network, a dataset class): "
                                                      "only for files you trust"),
                                          "train": dict(help="import and run the code a --config file names (a "
                                                        "module:factory network, a dataset class): only for files "
                                                        "you trust (--model on the command line needs no opt-in)")})


@dataclass(frozen=True)
class EvalOptions:
    """How ``test.py`` evaluates (and the multi-scale options ``demo.py`` shares)."""

    split: str = option("val", "split to evaluate (test: predictions only, no masks)", scripts=("test",))
    mode: Optional[str] = option(
        None, "testval: whole images at their size, as PyTorch-Encoding and mmsegmentation score (default); val: "
        "resized centre crops, batched, as validated during training; test: predict only (default for the test "
        "split); slide: whole images by "
        "overlapping windows (mmsegmentation's; testval, or test on the test split)",
        choices=("val", "testval", "test", "slide"), scripts=("test",))
    window: Optional[int] = option(None, "--mode slide window (default: --crop-size)", parse=positive_int,
                                   scripts=("test",))
    stride: Optional[int] = option(None, "--mode slide stride (default: 2/3 of --window)", parse=positive_int,
                                   scripts=("test",))
    window_batch: Optional[int] = option(None, "windows per forward, wherever windows run: --mode slide, and whole "
                                         "images larger than the crop at a scale (default: as many as 64 MiB holds "
                                         "on a CPU, half the free memory of a GPU; the labels do not depend on it)",
                                         parse=positive_int, metavar="N", scripts=EVAL)
    multi_scale: bool = option(False, "average over scales and flips with sliding windows (MultiEvalModule)",
                               scripts=EVAL)
    scales: Optional[Tuple[float, ...]] = option(None, "comma-separated scales for --multi-scale (default: "
                                                 "PyTorch-Encoding's for the dataset)", parse=scales, scripts=EVAL)
    limit: Optional[int] = option(None, "use only the first N samples", parse=positive_int, scripts=("test",))
    save_pred: Optional[str] = option(None, "write each whole-image prediction as a coloured PNG (dataset palette) "
                                      "named after its input file, at its size, with error maps (refused with --mode val)",
                                      metavar="DIR", scripts=("test",))
    out_dir: Optional[str] = option(None, "where metrics.json goes (default: the checkpoint's folder, else "
                                    "runs/<dataset>/<model>/eval)", scripts=EVAL + ("memory",), per_script={
                                        "demo": dict(default="demo", help="where the mask and overlay PNGs go "
                                                     "(default: demo)"),
                                        "memory": dict(default="runs/memory", help="where the report files go "
                                                       "(default: runs/memory); checked before any work")})
    inference: str = "whole"  # not an option: "slide" with --mode slide (resolve's rule)


@dataclass(frozen=True)
class DemoOptions:
    """What ``demo.py`` segments and draws."""

    images: Tuple[str, ...] = option((), "images, folders of images or quoted globs (any size)", flags=("images",),
                                     nargs="+", metavar="IMAGE", scripts=("demo",))
    alpha: float = option(0.5, "weight of the mask in the overlay, 0..1 (default: 0.5)", parse=unit_float,
                          scripts=("demo",))
    blend_background: bool = option(False, "blend the background class too (default: not)", scripts=("demo",))


#: Every group, by its name in :class:`~.resolve.Settings` (the order of the options in ``--help``).
GROUPS = {"demo": DemoOptions, "data": DataOptions, "model": ModelOptions, "devices": DeviceOptions,
          "optim": OptimOptions, "run": RunOptions, "weights": WeightOptions, "eval": EvalOptions}
