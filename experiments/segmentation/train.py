"""Train a segmentation model; by default the `shapes` recipe: a U-Net on a vgg_tiny backbone, on the embedded
generated `shapes` dataset (CPU when no GPU; about 2.5 minutes on 2 cores).

    python experiments/segmentation/train.py                                  # shapes, all GPUs or CPU
    python experiments/segmentation/train.py --dataset ade20k --model encnet --backbone resnet50 --aux --se-loss
    torchrun --nproc_per_node 4 experiments/segmentation/train.py --dataset citys ...   # DDP

One process drives all local GPUs with DataParallelModel + DataParallelCriterion (ungathered outputs, exact
loss reduction, SyncBatchNorm across replicas); under torchrun each process owns one device (DDP).

Parse the options (``options.py``), then the library runs them (:func:`encoding.engine.run_training`): the run
directory is locked; a checkpoint is written atomically after every epoch (never with NaN/inf inside); Ctrl-C
saves a resumable mid-epoch checkpoint and exits with 130; resuming continues bitwise where the run stopped
(docs/training.md, "Reliability"). Errors end the run with one line on stderr and exit status 1 (2: a bad
option); --traceback shows their trace.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from options import parse_args, training_config  # noqa: E402,F401  (parse_args: tests and users of train.py)

from encoding.engine import run_training  # noqa: E402
from encoding.utils.cli import run_cli  # noqa: E402


def main(argv=None, datasets=None) -> dict:
    """Run ``train.py`` with ``argv`` (on ``(train, val)`` ``datasets`` when given); returns the last evaluation.

    Raises:
        EncodingError (ConfigError: exit status 2; RunFailed, RunDirLocked, CheckpointError, DatasetError: 1),
            OSError: reported in one line by :func:`cli`.
        RunInterrupted: Ctrl-C; a resumable checkpoint was written (a ``SystemExit`` with status 130).
    """
    return run_training(training_config(argv), datasets)


def cli(argv=None, datasets=None) -> int:
    """``main`` for the command line: an ``EncodingError`` is one line on stderr, a bug keeps its traceback
    (``--traceback`` shows them all); returns the exit status."""
    return run_cli("train.py", main, argv, interrupted="interrupted before training started; nothing was saved",
                   datasets=datasets)


if __name__ == "__main__":
    sys.exit(cli())
