"""encoding: balanced multi-GPU semantic segmentation for PyTorch, in pure Python.

Subpackages:
    parallel: ``DataParallelModel`` / ``DataParallelCriterion`` with ungathered outputs and exact loss reduction.
    nn: ``SyncBatchNorm``, the ``Encoding`` layer, small generic blocks and ``SegmentationLosses``.
    models: dilated backbones and segmentation models, one file per architecture (``get_segmentation_model``).
    memory: per-device peak memory of a training step (simulated on fake tensors or measured), the split that
        balances it (``balance="memory"``) and the memory tool (``python -m encoding.memory``).
    datasets: segmentation datasets (``get_segmentation_dataset``) including the embedded ``shapes`` dataset.
    utils: metrics, learning-rate schedules, palettes, checkpoints, distributed helpers and logging.
    engine: training: small typed builders (``engine.builders``: devices, model, criterion, loaders, optimizer +
        schedule, dp/ddp wrapping), the loops (``train_one_epoch`` / ``evaluate``), the run (``engine.run``: resume,
        best model, the save / interrupt / non-finite rules; ``engine.state``: the checkpoint schema) and
        ``run_training`` (``engine.assemble``).
    inference: a trained network used and shared: ``load_model`` / ``segment`` (also at the top level), test.py's
        evaluation, the demo, model folders and the Hugging Face Hub.
    export: a trained network as an ONNX file or a torch.export program, with its metadata
        (``python -m encoding.export``).
    legacy: PyTorch-Encoding / vacancy / mmcv names and conventions on the core, each old name declared beside its
        object with the module where users import it (imported last, by this module).
    functions, transforms: PyTorch-Encoding's module paths (its functional forms and classification transforms,
        from ``encoding.legacy``), attributes after a bare ``import encoding`` as in PyTorch-Encoding.

``import encoding`` stays light: the memory tool's measuring and command-line modules, the web page (``encoding.app``,
gradio) and matplotlib load only when used.
"""
from .version import __version__
from . import utils, parallel, nn, datasets, models
from . import memory  # fills encoding.parallel's planner registry (DataParallelModel(balance="memory"))
from . import engine
from . import inference
from .inference import load_model, segment  # a trained network back from its checkpoint; its labels of an image
from . import export  # python -m encoding.export: ONNX / torch.export files with their metadata
from . import legacy  # old names declared on top of the core (last: it builds on everything above)
from . import functions, transforms  # PyTorch-Encoding's module paths (cheap: torch / torchvision are loaded)

__all__ = ["__version__", "parallel", "nn", "models", "datasets", "utils", "memory", "engine", "inference", "legacy",
           "export", "functions", "transforms", "load_model", "segment"]
