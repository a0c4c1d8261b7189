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
``pixel_accuracy``, ``intersection_and_union``, ``get_mask_pallete``, ``download``, ``mkdir``, ``check_sha1``) are
declared for this package beside their objects (``encoding/legacy/scheduler.py``, ``metrics.py``, ``helpers.py``,
``aliases.py``) and bound here when ``encoding`` is imported, as is ``PALETTE_NAMES``; each warns when used.
The other helpers stay importable from here and from their submodules; ``__all__`` lists what scripts call.
"""
from . import checkpoint, dist, files, logger, lr_scheduler, metrics, palette, table
from .checkpoint import (BEST_NAME, CHECKPOINT_FORMAT, CheckpointError, load_checkpoint, load_model_state,
                         read_state_dict, save_checkpoint, unwrap_model)
from .dist import (barrier, default_backend, get_local_rank, get_rank, get_world_size, init_distributed_mode,
                   is_main_process, reduce_across_processes)
from .logger import AverageMeter, EpochLogger, MetricLogger, SmoothedValue
from .lr_scheduler import IterationLR
from .metrics import SegmentationMetric, confusion_matrix, format_table, scores_from_confusion
from .palette import colorize, get_ignore_color, get_palette, overlay, voc_palette

__all__ = [
    # metrics
    "SegmentationMetric", "confusion_matrix", "format_table",
    # learning-rate schedule
    "IterationLR",
    # palettes
    "colorize", "overlay", "get_palette",
    # checkpoints and weights
    "save_checkpoint", "load_checkpoint", "load_model_state", "read_state_dict", "CheckpointError",
    # distributed
    "init_distributed_mode", "get_rank", "get_world_size", "is_main_process", "reduce_across_processes", "barrier",
    # logging
    "MetricLogger", "EpochLogger", "SmoothedValue",
]
