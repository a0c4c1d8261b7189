"""A training run from a configuration: :class:`TrainingConfig`, the checks of its values, and the whole command.

:class:`TrainingConfig` holds a run's options as typed fields (the names of ``train.py``'s options; the
checkpoint records them). :func:`build_training` builds a :class:`~.run.TrainingRun` from it with
:mod:`encoding.engine.builders`; :func:`run_training` is what ``train.py`` does after parsing: read the checkpoint once,
lock the run directory, build, train (or evaluate) and report.

Device policy:
    * launched by ``torchrun``: one device per process (nccl on CUDA, gloo on CPU), ``DistributedDataParallel``
      or the sharded ``strategy`` (:data:`~encoding.engine.builders.STRATEGIES`);
    * otherwise: one process drives ``device_ids`` (default: every CUDA device, or the CPU) through
      :class:`~encoding.parallel.DataParallelModel` + :class:`~encoding.parallel.DataParallelCriterion`.
"""
from __future__ import annotations

import os
import time
import sys
from dataclasses import asdict, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.utils.data import Dataset

from . import builders
from ..config import AMP_DTYPES, Settings, TrainingConfig
from ..utils.renamed import renamed_keyword
from ..config.evaluation import resume_problem
from ..config.parser import option_specs
from ..config.resolve import describe_sources
from ..config.training import flat_options
from ..datasets import class_weights as weights, datasets as DATASETS
from ..models.network import NetworkSpec
from ..parallel import resolve_devices
from ..utils.configfile import write_config
from ..utils.determinism import enable_determinism
from ..utils.dist import get_rank, init_distributed_mode, is_main_process, timeout_problem
from ..utils.images import set_max_pixels
from ..utils.metrics import SegmentationMetric
from ..utils.monitor import MonitorUnavailable, require
from ..utils.rundir import run_lock
from ..utils.table import format_table
from . import state
from .directory import RUN_CONFIG_NAME, check_run_dir, clear_earlier_run, made_dirs, replaces_earlier_run
from .data import (ConfigError, check_data_options, check_given_data, check_split, data_metadata, dataset_name,
                   dataset_options, drop_bad_samples, image_sizes, run_criterion, write_holdout)
from .resuming import check_resume, check_same_network  # check_resume: its old home
from .run import Hook, TrainingRun, base_dataset, resume, train

__all__ = ["AMP_DTYPES", "RUN_CONFIG_NAME", "parse_device_ids", "ConfigError", "check_network", "check_devices",
           "check_split", "check_training", "check_run_dir", "check_resume", "check_settings", "TrainingConfig",
           "config_header", "saved_config",
           "build_training", "run_training"]

#: What to do with a run directory rather than what the run is: not recorded in :data:`RUN_CONFIG_NAME` (the option
#: fields marked ``recorded=False``).
UNRECORDED = tuple(f.name for f, o in option_specs("train") if not o.recorded)

def parse_device_ids(text: Optional[str]) -> Optional[List[Any]]:
    """``"0,1"`` -> ``[0, 1]``; ``"cpu,cpu"`` -> ``["cpu", "cpu"]``; ``None``/``""`` -> ``None`` (the default)."""
    if not text:
        return None
    return [int(item) if item.strip().isdigit() else item.strip() for item in text.split(",") if item.strip()]


def check_network(dataset: str, model: str, backbone: str, *, aux: bool = False, se_loss: bool = False,
                  output_stride: Optional[int] = None, head_channels: Optional[int] = None,
                  recompute: Any = False, nclass: Optional[int] = None, pretrained_backbone: Any = False,
                  **old: Any) -> nn.Module:
    """Refuse a dataset or network the builders cannot make: the network is built on the ``meta`` device (no
    memory, no weights, no download), so every late error of the model's constructors is found now.

    ``recompute``: ``False`` (or ``"none"``), ``"backbone"`` or ``"all"``; ``checkpoint=`` is its old name
    (``FutureWarning``). A ``pretrained_backbone`` file must be there (nothing is read or downloaded).

    Returns:
        The network on the ``meta`` device.

    Raises:
        ConfigError: naming the option(s) and the valid values.
    """
    recompute = renamed_keyword(old, "checkpoint", "recompute", recompute, "check_network")
    if dataset not in DATASETS:
        raise ConfigError(f"--dataset {dataset}: unknown dataset; valid: {', '.join(sorted(DATASETS))}")
    network = NetworkSpec(model, nclass or DATASETS[dataset].NUM_CLASS or 2, backbone=backbone, aux=aux,
                          se_loss=se_loss, output_stride=output_stride, head_channels=head_channels,
                          recompute=recompute, pretrained_backbone=pretrained_backbone)
    return network.check(ConfigError)


def check_devices(text: Optional[str]) -> None:
    """Refuse ``--device-ids`` that do not name usable devices (a CUDA device listed twice included).

    Raises:
        ConfigError: naming the value.
    """
    if text is None:
        return
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise ConfigError(f"--device-ids {text}: empty entry; e.g. '0,1' or 'cpu,cpu'")
    try:
        devices = resolve_devices(parse_device_ids(text))
    except ValueError as err:
        raise ConfigError(f"--device-ids {text}: {str(err).splitlines()[0]}") from None
    cuda = [d for d in devices if d.type == "cuda"]
    if len(set(cuda)) != len(cuda):
        raise ConfigError(f"--device-ids {text}: a CUDA device is listed twice (only 'cpu' may repeat)")


def _check_start(c: "TrainingConfig") -> None:
    """Where the run starts: ``--eval`` / ``--ft`` need a checkpoint, ``--start-epoch`` a run that does not continue
    one (a resume continues at the checkpoint's epoch)."""
    for flag, what in (("eval", "--eval evaluates"), ("ft", "--ft fine-tunes the weights of")):
        if getattr(c, flag) and not c.resume:
            raise ConfigError(f"{what} a checkpoint: pass --resume <checkpoint.pth>")
    if c.resume and (problem := resume_problem(c.resume)):
        raise ConfigError(problem)
    if c.start_epoch >= c.epochs:
        raise ConfigError(f"--start-epoch {c.start_epoch} must be below --epochs {c.epochs}")
    if c.start_epoch and c.resume and not (c.ft or c.eval):
        raise ConfigError(f"--start-epoch {c.start_epoch}: a resume continues at its checkpoint's epoch; --start-epoch "
                          "numbers the epochs of a new run or of --ft")


def _check_schedule(c: "TrainingConfig") -> None:
    if c.warmup_epochs > c.epochs:  # equal: the warm-up takes the whole run (a one-epoch trial of a recipe)
        raise ConfigError(f"--warmup-epochs {c.warmup_epochs:g} is longer than the run (--epochs {c.epochs}): the "
                          "learning rate would never reach --lr")
    if c.lr_scheduler == "step" and c.lr_step < 1:
        raise ConfigError("--lr-scheduler step needs --lr-step N (epochs between two x0.1 decays)")


def check_training(config: "TrainingConfig", given_datasets: bool = False) -> None:
    """Refuse every option value of ``config`` that the run could only fail on later, before any directory is made
    or any data generated: where the run starts (``eval`` / ``ft`` / ``start_epoch`` / ``resume``'s file), dataset,
    splits, network, devices and schedule. It reads no file: whether the run directory already holds a run is
    :func:`check_run_dir`'s question, asked when the run starts.

    Raises:
        ConfigError: one line naming the option and the value.
    """
    c = config
    if not given_datasets or c.dataset in DATASETS:
        network = check_network(c.dataset, c.model, c.backbone, aux=c.aux, se_loss=c.se_loss,
                                output_stride=c.output_stride, head_channels=c.head_channels, recompute=c.recompute,
                                nclass=1 if c.binary or c.binary_class else None, pretrained_backbone=c.pretrained)
        _check_head_lr(c, network)
    for split, option in [] if given_datasets else [(c.train_split, "--train-split")] + (
            [] if c.no_val else [(c.val_split, "--val-split")]):
        check_split(c.dataset, split, option)
    _check_start(c)
    check_data_options(c)
    check_devices(c.device_ids)
    if problem := builders.strategy_problem(c.strategy, c.amp) or timeout_problem(c.dist_timeout) or \
            builders.torchrun_problem(c.balance, c.device_ids) or \
            builders.balance_problem(c.balance, parse_device_ids(c.device_ids), not c.no_cuda) or \
            weights.class_weights_problem(c.class_weights, None if c.binary or c.binary_class or c.dataset not in
                                          DATASETS else DATASETS[c.dataset].NUM_CLASS):
        raise ConfigError(problem)
    _check_schedule(c)
    try:
        for name in (n for n in ("tensorboard", "wandb") if getattr(c, n)):
            require(name)
    except MonitorUnavailable as err:
        raise ConfigError(str(err)) from None


def _check_head_lr(c: "TrainingConfig", model: nn.Module) -> None:
    """Refuse a ``--head-lr-mult`` given for a network of one parameter group (no backbone module to tell from its
    heads): it would apply to nothing. ``model``: the network (its ``meta`` twin before any work). Given on the
    command line or in a ``--config`` file (a run's saved config.yaml records the rule's 1 for such a network)."""
    source = c.sources.get("head_lr_mult", "")
    if c.head_lr_mult != 1 and source.startswith(("command line", "config file")) and \
            len(builders.param_groups(model)) == 1:
        raise ConfigError(f"--head-lr-mult {c.head_lr_mult}" + ("" if source == "command line" else f" ({source})")
                          + f": {c.model} has no backbone module to tell from its heads (one learning rate for every "
                          "parameter)")


def check_settings(settings: Settings) -> None:
    """Refuse the settings of a script that cannot work, before any work (:func:`check_training` for ``train.py``;
    the network, split and devices of ``test.py`` / ``demo.py``); warn of a crop larger than the base size.

    Raises:
        ConfigError: one line naming the option and the value.
    """
    s = settings.options()  # a spec network's --backbone: refused as it is resolved
    if settings.script != "train":
        if not s["model_zoo"]:
            check_network(s["dataset"], s["model"], s["backbone"], aux=s["aux"], se_loss=s["se_loss"],
                          output_stride=s["output_stride"], head_channels=s["head_channels"])
        if settings.script == "test":
            check_split(s["dataset"], s["split"], "--split", masks=s["mode"] != "test")
        check_devices(s.get("device_ids"))
        return
    check_training(settings.training())
    base, crop = s["base_size"], s["crop_size"]
    if base is not None and crop is not None and crop > base:
        sys.stderr.write(f"warning: --crop-size {crop} is larger than --base-size {base}: training images are "
                         "scaled around the base size, so most of each crop will be padding\n")


def config_header(config: TrainingConfig) -> str:
    """The comment at the top of :data:`RUN_CONFIG_NAME`: how to repeat the run, and where each value came from."""
    lines = ["the options of this run: `train.py --config <this file>` repeats it (--resume, --overwrite and --eval "
             "are not recorded)"]
    recorded = saved_config(config)
    sources = {k: v for k, v in config.sources.items() if k in recorded}
    if sources:
        lines += ["where each value came from (the others are the defaults; docs/configs.md, 'Where a setting comes "
                  "from'):"] + describe_sources(sources)
    return "\n".join(lines)


def saved_config(config: TrainingConfig) -> Dict[str, Any]:
    """What :data:`RUN_CONFIG_NAME` records: every option but :data:`UNRECORDED` (``resume`` is kept with ``ft``: the
    weights a fine-tuning starts from are part of the run)."""
    return {k: v for k, v in flat_options(config).items() if k not in UNRECORDED or (k == "resume" and config.ft)}


def build_training(config: TrainingConfig, *, datasets: Optional[Tuple[Dataset, Dataset]] = None,
                   checkpoint: Optional[state.Checkpoint] = None) -> TrainingRun:
    """Build the run of ``config`` with :mod:`encoding.engine.builders`, restored from ``checkpoint`` when given.

    Args:
        datasets: ``(train, val)`` datasets to train on instead of building ``config.dataset``'s.
        checkpoint: ``config.resume`` read (:func:`.state.read`): the training state (weights only with ``ft`` or
            ``eval``) comes from it.

    Raises:
        ValueError: unknown dataset/model/backbone (listing the valid names) or bad device ids.
        CheckpointError: the checkpoint does not match the model.
    """
    c, replacing = config, replaces_earlier_run(config)  # the directory's hold-out list is the earlier run's
    distributed = init_distributed_mode(timeout_s=c.dist_timeout)
    torch.manual_seed(c.seed + get_rank())
    placement = builders.select_devices(parse_device_ids(c.device_ids), use_cuda=not c.no_cuda,
                                        distributed=distributed)
    device = placement.model_device
    counts = dict(batch_size=c.batch_size, test_batch_size=c.test_batch_size, workers=c.workers, seed=c.seed,
                  train_limit=c.train_limit, val_limit=c.val_limit, distributed=distributed,
                  pin_memory=device.type == "cuda")  # how the loaders draw and count the samples
    loaders = builders.build_loaders(
        c.dataset, root=c.data_root, train_split=c.train_split, val_split=c.val_split, skip_bad=c.skip_bad,
        datasets=datasets, dataset_options=dataset_options(c, fresh=replacing), validated=not c.no_val,
        **counts, **image_sizes(c))
    built = (base_dataset(loaders.train), base_dataset(loaders.val))
    if c.verify_data and not c.eval and drop_bad_samples(built):  # before the samplers and the schedule count
        loaders = builders.build_loaders(c.dataset, datasets=built, **counts)
    train_data, binary = base_dataset(loaders.train), c.binary or c.binary_class is not None
    meta = data_metadata(c, train_data, base_dataset(loaders.val), binary, holdout=not replacing)
    class_names = meta["classes"]
    model = NetworkSpec.from_options(c, 1 if binary else len(class_names), sync_bn=placement.synced,
                                     pretrained_backbone=c.pretrained).build(device)
    criterion = run_criterion(c, len(class_names), binary, device, loaders.train.dataset)
    model, criterion = builders.wrap_model(model, criterion, placement, strategy=c.strategy,
                                           balance=None if c.balance == "none" else c.balance, compile=c.compile,
                                           optimizer=dict(kind=c.optimizer, momentum=c.momentum,
                                                          weight_decay=c.weight_decay))
    optimizer = builders.build_optimizer(model, c.lr, kind=c.optimizer, momentum=c.momentum,
                                         weight_decay=c.weight_decay, zero_redundancy=c.strategy == "zero1")
    _check_head_lr(c, model)
    scheduler = builders.build_scheduler(optimizer, c.lr_scheduler, c.lr, c.epochs, len(loaders.train),
                                         lr_step=c.lr_step, warmup_epochs=c.warmup_epochs,
                                         head_lr_mult=c.head_lr_mult)
    amp_dtype = AMP_DTYPES[c.amp]
    scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
    start = resume(checkpoint, model, optimizer, scheduler, scaler, len(loaders.train),
                   weights_only=c.ft or c.eval, start_epoch=c.start_epoch)
    return TrainingRun(model=model, criterion=criterion, optimizer=optimizer, scheduler=scheduler,
                       train_loader=loaders.train, val_loader=loaders.val,
                       metric=SegmentationMetric(len(class_names), ignore_index=-1, device=device, binary=binary,
                                                 threshold=c.threshold),
                       class_names=class_names, output_dir=c.run_dir, options={**asdict(c), **meta},
                       epochs=c.epochs,
                       input_device=placement.input_device, device_ids=placement.device_ids,
                       distributed=distributed, amp_dtype=amp_dtype, scaler=scaler, clip_grad=c.clip_grad,
                       validate=not c.no_val, count_skipped=c.skip_bad, start=start, samplers=loaders.samplers,
                       log_options=dict(tensorboard=c.tensorboard, wandb=c.wandb, config=saved_config(c)),
                       log_images=c.log_images)


def run_training(config: TrainingConfig, datasets: Optional[Tuple[Dataset, Dataset]] = None, *,
                 hooks: Sequence[Hook] = ()) -> Dict[str, Any]:
    """Train (or, with ``eval``, evaluate) the run of ``config`` (with the caller's ``hooks``: :func:`~.run.train`);
    returns the last evaluation result.

    The checkpoint of ``resume`` is read once, before anything else: a run that already completed ``epochs`` says so
    and stops; the training state, the best model file and the log are restored from that one read. The run
    directory is locked before any work (a second run into it, or an unwritable directory, is refused at once).

    Raises:
        ConfigError: an option value the run cannot use (:func:`check_training`, :func:`check_run_dir`,
            :func:`check_resume`), before any
            directory is made.
        RunFailed, RunDirLocked, CheckpointError, DatasetError, OSError: reported in one line by the script.
        RunInterrupted: Ctrl-C; a resumable checkpoint was written (a ``SystemExit`` with status 130).
    """
    started = time.perf_counter()
    if datasets is not None:  # the run is named after the datasets given, not config.dataset
        config = replace(config, dataset=dataset_name(datasets[0]))
    if config.max_pixels is not None:
        set_max_pixels(config.max_pixels)  # every image the run reads: checked from its header before decoding
    if config.data_root:  # recorded absolute: test.py, demo.py and load_model find the data from any folder
        config = replace(config, data_root=os.path.abspath(os.path.expanduser(config.data_root)))
    check_training(config, given_datasets=datasets is not None)
    check_run_dir(config)
    if config.deterministic:
        enable_determinism()
    checkpoint = state.read(config.resume) if config.resume else None  # the one read of the file
    resumed = checkpoint is not None and not (config.ft or config.eval)
    main = int(os.environ.get("RANK", "0")) == 0  # the launch's main process (before any process group)
    if resumed and checkpoint.finished(config.epochs):
        if main:
            state.complete_finished(config.run_dir, checkpoint)  # a run killed after its last checkpoint
        print(f"nothing to do: {config.resume} already completed {checkpoint.done} of --epochs {config.epochs}; "
              "raise --epochs to train further")
        return {}
    if resumed:
        check_resume(config, checkpoint, given_datasets=datasets is not None)  # names the checkpoint: first
    if checkpoint is not None and not config.ft:
        check_same_network(config, checkpoint)
    if datasets is not None:
        check_given_data(config, datasets)
    with made_dirs(config.run_dir), run_lock(config.run_dir, enabled=not config.eval):  # before any work
        run = build_training(config, datasets=datasets, checkpoint=checkpoint)  # the checkpoint's weights fit
        if replaces_earlier_run(config) and main:  # --overwrite: only now that the run can start
            clear_earlier_run(config.run_dir)
            write_holdout(config, base_dataset(run.train_loader))
        if is_main_process():
            print(run.describe())
        if config.eval:
            result = run.evaluate()
            if is_main_process():
                print(format_table(result, run.class_names))
            return result
        if is_main_process():
            write_config(os.path.join(config.run_dir, RUN_CONFIG_NAME), saved_config(config),
                         header=config_header(config))
        result = train(run, checkpoint if resumed else None, hooks=hooks)  # data verified when built
    if result and is_main_process():
        print(format_table(result, run.class_names))
        print(f"done in {time.perf_counter() - started:.1f} s: pixAcc {result['pixAcc']:.4f}, "
              f"mIoU {result['mIoU']:.4f}")
    return result
