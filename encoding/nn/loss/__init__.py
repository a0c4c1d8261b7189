"""encoding.nn.loss: every segmentation loss, reduced exactly across replicas, and ``LOSSES`` (``train.py --loss``).

One module per loss family; each loss is a :class:`SegmentationLosses` (or one whose pixel term is replaced), so the
auxiliary and SE terms, class weights (``weight``), ``ignore_index``, dict / tensor outputs, PyTorch-Encoding's
argument layouts and the target checks are the same for all:

* :mod:`.cross_entropy`: :class:`SegmentationLosses` (cross-entropy + aux + SE, PyTorch-Encoding's class and path:
  ``from encoding.nn.loss import SegmentationLosses``) and :func:`loss_inputs` (PE's layouts as the core call);
* :mod:`.ohem`: :class:`OhemCrossEntropy` (online hard example mining);
* :mod:`.dice`, :mod:`.focal`, :mod:`.lovasz`: :class:`DiceLoss`, :class:`FocalLoss`, :class:`LovaszSoftmaxLoss`
  (and :func:`lovasz_softmax_flat`), on what they share in :mod:`.pixel`.

Focal and the cross-entropies are per-pixel means: :class:`~encoding.parallel.LossTerm` ``(total, count)``. Dice and
batch Lovász-Softmax are not means of per-pixel values: their pixel terms are
:class:`~encoding.parallel.reduction.StatisticsTerm`\\ s -- Dice's per-class intersections and cardinalities are
summed over the replicas, Lovász's valid-pixel probabilities and labels concatenated -- finished on the output
device by the same function a single device applies to the whole batch. So under
:class:`~encoding.parallel.DataParallelCriterion` each loss equals (value and gradients) the single-device loss of the
whole batch. Conventions follow ``segmentation_models_pytorch`` (``mode="multiclass"``) where noted; ``docs/nn.md``
lists them and the tests compare with smp numerically. The binary (one-channel) losses are :mod:`encoding.nn.binary`.

``encoding.nn.losses`` is this module's old name (declared in :mod:`encoding.legacy.aliases`; its names warn when
used).
"""
from __future__ import annotations

from typing import Type

from ...registry import Registry
from .cross_entropy import SegmentationLosses, loss_inputs
from .dice import DiceLoss
from .focal import FocalLoss
from .lovasz import LovaszSoftmaxLoss, lovasz_softmax_flat
from .ohem import OhemCrossEntropy

__all__ = ["SegmentationLosses", "OhemCrossEntropy", "loss_inputs", "DiceLoss", "FocalLoss", "LovaszSoftmaxLoss",
           "lovasz_softmax_flat", "LOSSES"]

#: ``train.py --loss`` name -> the criterion class (all take :class:`SegmentationLosses`' arguments).
LOSSES: Registry[Type[SegmentationLosses]] = Registry("loss", {
    "ce": SegmentationLosses, "ohem": OhemCrossEntropy, "dice": DiceLoss, "focal": FocalLoss,
    "lovasz": LovaszSoftmaxLoss})
