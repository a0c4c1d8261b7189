"""encoding.utils: what training and evaluation scripts call; everything else stays in the submodules.

Modules:
    metrics: ``SegmentationMetric`` (one confusion matrix, NaN-aware means); table: ``format_table``.
    lr_scheduler: ``IterationLR`` (poly / cos / step with warm-up, 10x heads), a torch scheduler.
    palette: rendering of label masks (``colorize``, ``overlay``); the colours belong to the dataset classes.
    checkpoint: atomic ``save_checkpoint``, safe ``load_checkpoint``, and the one weight reader / checked loader.
    dist: ``init_distributed_mode`` from torchrun and rank / world-size / reduction helpers.
    logger: ``MetricLogger`` for progress bars and ``EpochLogger`` (CSV + JSONL, optional TensorBoard).
    files: download / verify / extract helpers and ``atomic_write`` (``encoding.utils.files``).

PyTorch-Encoding's names (``LR_Scheduler``, ``LR_Scheduler_Head``, ``batch_pix_accuracy``, ``batch_intersection_union``,
``pixel_accuracy``, ``intersection_and_union``, ``get_mask_pallete``, ``mkdir``, ``check_sha1``) are importable from
here as before; their conventions are implemented in :mod:`encoding.compat`.
"""
from . import checkpoint, dist, files, logger, lr_scheduler, metrics, palette, table
from .checkpoint import (BEST_NAME, CHECKPOINT_FORMAT, CheckpointError, load_checkpoint, load_model_state,
                         read_state_dict, save_checkpoint, unwrap_model)
from .dist import (barrier, default_backend, get_local_rank, get_rank, get_world_size, init_distributed_mode,
                   is_main_process, reduce_across_processes)
from .files import download
from .logger import AverageMeter, EpochLogger, MetricLogger, SmoothedValue
from .lr_scheduler import IterationLR
from .metrics import SegmentationMetric, confusion_matrix, format_table, scores_from_confusion
from .palette import colorize, get_ignore_color, get_palette, overlay, voc_palette

__all__ = [
    # metrics
    "SegmentationMetric", "confusion_matrix", "scores_from_confusion", "format_table",
    "batch_pix_accuracy", "batch_intersection_union", "pixel_accuracy", "intersection_and_union",
    # learning-rate schedules
    "IterationLR", "LR_Scheduler", "LR_Scheduler_Head",
    # palettes
    "PALETTE_NAMES", "get_palette", "get_ignore_color", "voc_palette", "colorize", "get_mask_pallete", "overlay",
    # checkpoints and weights
    "save_checkpoint", "load_checkpoint", "load_model_state", "read_state_dict", "unwrap_model", "CheckpointError",
    "CHECKPOINT_FORMAT", "BEST_NAME",
    # distributed
    "init_distributed_mode", "get_rank", "get_local_rank", "get_world_size", "is_main_process", "barrier",
    "reduce_across_processes", "default_backend",
    # logging
    "MetricLogger", "SmoothedValue", "EpochLogger", "AverageMeter",
    # PyTorch-Encoding file helpers (the rest is in encoding.utils.files)
    "download", "mkdir", "check_sha1",
    # submodules
    "checkpoint", "dist", "files", "logger", "lr_scheduler", "metrics", "palette", "table",
]


def __getattr__(name: str):
    """``PALETTE_NAMES`` (from the dataset registry, on first use) and the PE names implemented in compat."""
    if name == "PALETTE_NAMES":
        return palette.PALETTE_NAMES
    from .. import compat

    return compat.export(__name__, name)
