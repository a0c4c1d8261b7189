"""PyTorch-Encoding conventions, implemented once on top of the clean core.

The core of each feature has one convention; the second conventions that PyTorch-Encoding (PE) users rely on are
implemented here, and every public PE name stays importable from where PE users import it (the packages resolve
those names from this module):

==============================================  ==================================  ==================================
PE name / convention                            core it is built on                 importable from
==============================================  ==================================  ==================================
``LR_Scheduler`` (optimizer optional,           :class:`~encoding.utils.            ``encoding.utils``,
``scheduler(optimizer, i, epoch, best_pred)``)  lr_scheduler.IterationLR`` (torch   ``encoding.utils.lr_scheduler``
and ``LR_Scheduler_Head``                       style: ``step()`` per iteration)
loss layouts ``(out[, se][, aux])`` and         ``criterion(output_dict_or_tensor,  ``encoding.nn.SegmentationLosses``
``criterion(out, se, aux, target)``             target)``                           (adapted by :func:`loss_inputs`)
``batch_pix_accuracy``,                         :func:`~encoding.utils.metrics.     ``encoding.utils``,
``batch_intersection_union``,                   confusion_matrix` (target ``-1`` =  ``encoding.utils.metrics``
``pixel_accuracy``, ``intersection_and_union``  ignore; CSAIL helpers: ``0``)
``get_mask_pallete``                            :func:`~encoding.utils.colorize`    ``encoding.utils``,
                                                                                    ``encoding.utils.palette``
``get_dataset``                                 :func:`~encoding.datasets.          ``encoding.datasets``
                                                get_segmentation_dataset`
``DistSyncBatchNorm``                           :class:`~encoding.nn.SyncBatchNorm` ``encoding.nn``
``mkdir``, ``check_sha1``                       :func:`~encoding.utils.files.       ``encoding.utils``,
                                                makedirs`, ``check_checksum``      ``encoding.utils.files``
==============================================  ==================================  ==================================

Layer and wrapper names of PE, Synchronized-BatchNorm (vacancy) and mmcv are thin layers kept beside their cores:
:mod:`encoding.nn.compat` (``BatchNorm2d``, ``SynchronizedBatchNorm2d``, ``convert_model``, ``revert_sync_batchnorm``,
small PE layers), :mod:`encoding.parallel.compat` (``is_module_wrapper``), :mod:`encoding.functions` and
:mod:`encoding.transforms`. ``docs/migration.md`` lists every name, where it lives and its status.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
from PIL import Image
from torch import Tensor
from torch.optim import Optimizer

from .datasets import get_segmentation_dataset
from .nn.syncbn import SyncBatchNorm
from .utils.files import check_checksum, makedirs
from .utils.lr_scheduler import IterationLR, logger as _schedule_logger
from .utils.metrics import confusion_matrix, to_labels
from .utils.palette import PaletteLike, colorize

__all__ = [
    "LR_Scheduler", "LR_Scheduler_Head", "loss_inputs", "batch_pix_accuracy", "batch_intersection_union",
    "pixel_accuracy", "intersection_and_union", "get_mask_pallete", "get_dataset", "DistSyncBatchNorm", "mkdir",
    "check_sha1", "EXPORTS", "export",
]

_METRIC_HELPERS = ("batch_pix_accuracy", "batch_intersection_union", "pixel_accuracy", "intersection_and_union")
_SCHEDULERS = ("LR_Scheduler", "LR_Scheduler_Head")

#: Module -> the PE names it resolves from here (through its module ``__getattr__``).
EXPORTS: Dict[str, Tuple[str, ...]] = {
    "encoding.utils": _SCHEDULERS + _METRIC_HELPERS + ("get_mask_pallete", "mkdir", "check_sha1"),
    "encoding.utils.files": ("mkdir", "check_sha1"),
    "encoding.utils.lr_scheduler": _SCHEDULERS,
    "encoding.utils.metrics": _METRIC_HELPERS,
    "encoding.utils.palette": ("get_mask_pallete",),
    "encoding.datasets": ("get_dataset",),
    "encoding.nn": ("DistSyncBatchNorm",),
}


def export(module: str, name: str) -> Any:
    """The PE name ``name`` that ``module`` re-exports (a module's ``__getattr__`` calls this).

    Raises:
        AttributeError: ``module`` does not re-export ``name``.
    """
    if name in EXPORTS.get(module, ()):
        return globals()[name]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------------------------------------------------
# Learning-rate schedule: PE's driving style on top of the torch-style IterationLR
# ----------------------------------------------------------------------------------------------------------------------
class LR_Scheduler(IterationLR):  # noqa: N801 - PyTorch-Encoding name
    """PyTorch-Encoding's scheduler: :class:`~encoding.utils.lr_scheduler.IterationLR` with an optional optimizer.

    Two ways to drive it:

    * PE style: ``scheduler(optimizer, i, epoch, best_pred)`` at every iteration (no optimizer needed up front);
    * torch style: ``LR_Scheduler(..., optimizer=opt)`` sets the rate of iteration 0 right away, then
      ``scheduler.step()`` after each ``optimizer.step()``.

    ``state_dict()``/``load_state_dict()`` resume either way; ``last_epoch`` counts *iterations* (the last ``T``
    applied), as in the core.

    Signature: ``LR_Scheduler(mode, base_lr, num_epochs, iters_per_epoch, lr_step=0, warmup_epochs=0, *,
    optimizer=None, head_multiplier=10.0, power=0.9)``.

    Args:
        mode, base_lr, num_epochs, iters_per_epoch: as in :class:`~encoding.utils.lr_scheduler.IterationLR`.
        *steps: ``lr_step`` (epochs between two ×0.1 decays, ``step`` mode) and ``warmup_epochs``.
        optimizer: attach an optimizer to use the scheduler torch-style (``step()``); optional for PE style.
        **options: ``head_multiplier`` (factor of groups after the first, default 10) and ``power`` (poly, 0.9).

    Example:
        >>> opt = torch.optim.SGD([{"params": backbone}, {"params": head}], lr=0.01)  # doctest: +SKIP
        >>> sched = LR_Scheduler("poly", 0.01, num_epochs=50, iters_per_epoch=len(loader))  # doctest: +SKIP
        >>> for epoch in range(50):  # doctest: +SKIP
        ...     for i, batch in enumerate(loader):
        ...         sched(opt, i, epoch, best_pred)      # backbone 0.01 * f(T), head 0.1 * f(T)
    """

    def __init__(self, mode: str, base_lr: float, num_epochs: int, iters_per_epoch: int, *steps: int,
                 optimizer: Optional[Optimizer] = None, **options: float) -> None:
        # steps: (lr_step, warmup_epochs); options: head_multiplier, power -- the core's schedule arguments
        self._configure(mode, base_lr, num_epochs, iters_per_epoch, *steps, **options)
        if optimizer is not None:
            self._attach(optimizer)

    def __call__(self, optimizer: Optimizer, i: int, epoch: int, best_pred: Optional[float] = None) -> float:
        """Set the rates for iteration ``i`` of ``epoch`` (PE style) and return group 0's rate."""
        lr = self.apply(optimizer, epoch * self.iters_per_epoch + i)
        if epoch > self.epoch:
            best = "" if best_pred is None else f", previous best = {best_pred:.4f}"
            _schedule_logger.info("Epoch %d, learning rate = %.6g%s", epoch, lr, best)
            self.epoch = epoch
        return lr

    def _attached(self) -> Optimizer:
        if self.optimizer is None:
            raise RuntimeError("no optimizer attached: pass optimizer= to LR_Scheduler, or call "
                               "scheduler(optimizer, i, epoch, best_pred) PyTorch-Encoding style")
        return self.optimizer


#: PyTorch-Encoding's name for the scheduler with 10x head groups (:class:`LR_Scheduler` already does that).
LR_Scheduler_Head = LR_Scheduler


# ----------------------------------------------------------------------------------------------------------------------
# Loss argument layouts
# ----------------------------------------------------------------------------------------------------------------------
def loss_inputs(inputs: Tuple[Any, ...], se_loss: bool, aux: bool) -> Tuple[Dict[str, Tensor], Any]:
    """PyTorch-Encoding's loss arguments as the core call ``(output_dict, target)``.

    Args:
        inputs: ``(output, target)`` with ``output`` a tensor or an ``(out[, se][, aux])`` tuple/list (the SE logits
            before the auxiliary output, as PE's EncNet returns them), or the flat ``(out[, se][, aux], target)``.
        se_loss: whether the criterion uses the SE logits.
        aux: whether the criterion uses the auxiliary output.

    Returns:
        ``({"out": ..., ["se": ...], ["aux": ...]}, target)``.

    Raises:
        ValueError: the number of tensors does not fit ``se_loss`` / ``aux``.
    """
    *preds, target = inputs
    output = preds[0] if len(preds) == 1 else tuple(preds)
    seq = (output,) if isinstance(output, Tensor) else tuple(output)
    if len(seq) != 1 + int(se_loss) + int(aux):
        layout = "(out" + (", se" if se_loss else "") + (", aux" if aux else "") + ")"
        raise ValueError(f"with se_loss={se_loss}, aux={aux} the model output must be {layout}, "
                         f"got {len(seq)} tensor(s)")
    named = {"out": seq[0]}
    if se_loss:
        named["se"] = seq[1]
    if aux:
        named["aux"] = seq[-1]
    return named, target


# ----------------------------------------------------------------------------------------------------------------------
# Metric helpers (PE's functional forms and the CSAIL label convention)
# ----------------------------------------------------------------------------------------------------------------------
def batch_pix_accuracy(output: Tensor, target: Tensor) -> Tuple[int, int]:
    """Correct and labeled pixel counts of a batch (PyTorch-Encoding helper).

    Args:
        output: logits ``BxCxHxW`` (or labels shaped like ``target``).
        target: int labels ``BxHxW``; negative values are unlabeled.

    Returns:
        ``(pixel_correct, pixel_labeled)`` as Python ints.
    """
    labels, _ = to_labels(output, target)
    target = target.to(labels.device)
    labeled = target >= 0
    correct = (labels == target) & labeled
    return int(correct.sum()), int(labeled.sum())


def batch_intersection_union(output: Tensor, target: Tensor, nclass: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per-class intersection and union pixel counts of a batch (PyTorch-Encoding helper).

    Args:
        output: logits ``BxCxHxW`` (or labels shaped like ``target``).
        target: int labels ``BxHxW`` with ``-1`` for unlabeled pixels.
        nclass: number of classes.

    Returns:
        ``(area_inter, area_union)``: int64 numpy arrays of length ``nclass``. Unlike PE, a target value outside
        ``[0, nclass)`` other than ``-1`` raises ``ValueError`` instead of being silently dropped.
    """
    conf = confusion_matrix(output, target, nclass, ignore_index=-1).cpu()
    inter = conf.diagonal()
    union = conf.sum(dim=0) + conf.sum(dim=1) - inter
    return inter.numpy().astype(np.int64), union.numpy().astype(np.int64)


def pixel_accuracy(im_pred: Any, im_lab: Any) -> Tuple[int, int]:
    """Correct and labeled pixel counts of one image, CSAIL scene-parsing convention (label 0 = unlabeled).

    Args:
        im_pred: predicted labels (array-like).
        im_lab: ground-truth labels (array-like), 0 for unlabeled pixels.

    Returns:
        ``(pixel_correct, pixel_labeled)``.
    """
    pred, lab = np.asarray(im_pred), np.asarray(im_lab)
    labeled = lab > 0
    return int(np.sum((pred == lab) & labeled)), int(np.sum(labeled))


def intersection_and_union(im_pred: Any, im_lab: Any, num_class: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per-class intersection and union of one image, PyTorch-Encoding's CSAIL-style helper.

    Labels use 0 for unlabeled pixels and ``1 .. num_class - 1`` for the classes (``num_class`` counts the
    unlabeled value, as in PE). Predictions on unlabeled pixels are not counted; values outside
    ``[1, num_class - 1]`` are dropped, as PE's ``np.histogram`` did.

    Returns:
        ``(area_inter, area_union)``: int64 arrays of length ``num_class - 1`` (entry ``k`` is class ``k + 1``).
    """
    pred = np.asarray(im_pred).astype(np.int64).ravel()
    lab = np.asarray(im_lab).astype(np.int64).ravel()
    pred = pred * (lab > 0)
    bins = num_class - 1

    def area(values: np.ndarray) -> np.ndarray:
        values = values[(values >= 1) & (values <= bins)]
        return np.bincount(values - 1, minlength=bins)[:bins].astype(np.int64)

    area_inter = area(pred[pred == lab])
    area_union = area(pred) + area(lab) - area_inter
    return area_inter, area_union


# ----------------------------------------------------------------------------------------------------------------------
# Other PE names
# ----------------------------------------------------------------------------------------------------------------------
def get_mask_pallete(npimg: Any, dataset: PaletteLike = "detail") -> Image.Image:
    """PyTorch-Encoding's name (and spelling) for :func:`encoding.utils.colorize`; the input is never modified."""
    return colorize(npimg, dataset)


#: PyTorch-Encoding's name of :func:`encoding.datasets.get_segmentation_dataset`.
get_dataset = get_segmentation_dataset

#: PyTorch-Encoding's distributed SyncBatchNorm: one class synchronises replicas and processes here.
DistSyncBatchNorm = SyncBatchNorm


def mkdir(path: str) -> str:
    """PyTorch-Encoding's name of :func:`encoding.utils.files.makedirs`."""
    return makedirs(path)


def check_sha1(filename: str, sha1_hash: str) -> bool:
    """PyTorch-Encoding helper: whether ``filename`` has the given SHA-1 (see ``files.check_checksum``)."""
    return check_checksum(filename, "sha1:" + sha1_hash)
