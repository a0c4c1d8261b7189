"""encoding: balanced multi-GPU semantic segmentation for PyTorch, in pure Python.

Subpackages:
    parallel: ``DataParallelModel`` / ``DataParallelCriterion`` with ungathered outputs and exact loss reduction.
    nn: ``SyncBatchNorm``, the ``Encoding`` layer, segmentation heads and ``SegmentationLosses``.
    models: dilated backbones and segmentation models (``get_segmentation_model``, ``get_model``).
    datasets: segmentation datasets (``get_segmentation_dataset``) including the embedded ``shapes`` dataset.
    utils: metrics, learning-rate schedules, palettes, checkpoints, distributed helpers and logging.
    engine: ``train_one_epoch`` / ``evaluate`` loops; run: assembling a training run from options.
"""
from .version import __version__
from . import utils, parallel, nn, datasets, models, engine, run

__all__ = ["__version__", "parallel", "nn", "models", "datasets", "utils", "engine", "run"]
