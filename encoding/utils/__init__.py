"""encoding.utils: metrics, learning-rate schedules, palettes, checkpoints, distributed helpers, logging and files.

Modules:
    metrics: ``SegmentationMetric`` (one confusion matrix, NaN-aware means) and PyTorch-Encoding's functional helpers.
    lr_scheduler: ``LR_Scheduler`` (poly / cos / step with warm-up, 10x heads), PE style or as a torch scheduler.
    palette: dataset colour maps, ``colorize``, ``get_mask_pallete`` and ``overlay``.
    checkpoint: atomic ``save_checkpoint`` and safe ``load_checkpoint`` (``weights_only=True``).
    dist: ``init_distributed_mode`` from torchrun and rank / world-size / reduction helpers.
    logger: ``MetricLogger`` for progress bars and ``EpochLogger`` (CSV + JSONL, optional TensorBoard).
    files: download / verify / extract helpers.
"""
from . import files  # noqa: F401
from .files import *  # noqa: F401,F403
from . import checkpoint, dist, logger, lr_scheduler, metrics, palette
from .checkpoint import *  # noqa: F401,F403
from .dist import *  # noqa: F401,F403
from .logger import *  # noqa: F401,F403
from .lr_scheduler import *  # noqa: F401,F403
from .metrics import *  # noqa: F401,F403
from .palette import *  # noqa: F401,F403

__all__ = (
    list(files.__all__)
    + metrics.__all__
    + lr_scheduler.__all__
    + palette.__all__
    + checkpoint.__all__
    + dist.__all__
    + logger.__all__
)
