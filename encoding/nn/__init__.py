"""encoding.nn: synchronized BatchNorm, the Encoding layer, small generic blocks and the losses (pure PyTorch).

PyTorch-Encoding's, vacancy's and mmcv's names (``BatchNorm2d``, ``SynchronizedBatchNorm2d``, ``convert_model``,
``DistSyncBatchNorm``, the heads ``FCNHead`` / ``PSPHead`` / ... that now live in ``encoding.models``, ...) are bound
here by :mod:`encoding.legacy` (``legacy.ALIASES``) when ``encoding`` is imported; they are not part of ``__all__``.
So are ``SegmentationLosses`` / ``OhemCrossEntropy``: ``encoding.nn`` names ``encoding.legacy``'s subclasses, which
also accept PyTorch-Encoding's argument layouts; the core classes, which take ``(output_dict_or_tensor, target)``,
are :mod:`encoding.nn.loss`'s. Dice, Focal and Lovász-Softmax (and ``LOSSES``, the names of ``train.py --loss``)
are :mod:`encoding.nn.losses`'.
"""
from . import binary, blocks, encoding, loss, losses, recompute, syncbn
from .blocks import NormLayer, SeparableConv2d, conv_norm_act, resize
from .encoding import Encoding
from .loss import OhemCrossEntropy, SegmentationLosses
from .binary import BINARY_LOSSES, BinaryBCELoss, BinaryDiceLoss, BinaryFocalLoss
from .losses import LOSSES, DiceLoss, FocalLoss, LovaszSoftmaxLoss
from .recompute import (CHECKPOINT_POLICIES, checkpoint_module, checkpoint_segmentation_model, disable_checkpointing,
                        enable_checkpointing, is_checkpointed, is_recomputing, replay_in_recomputation)
from .syncbn import SyncBatchNorm, SyncBatchNormAct, convert_sync_batchnorm

__all__ = [
    # synchronized BatchNorm
    "SyncBatchNorm", "SyncBatchNormAct", "convert_sync_batchnorm",
    # losses
    "SegmentationLosses", "OhemCrossEntropy", "DiceLoss", "FocalLoss", "LovaszSoftmaxLoss", "LOSSES",
    "BinaryBCELoss", "BinaryDiceLoss", "BinaryFocalLoss", "BINARY_LOSSES",
    # the Encoding layer and small blocks
    "Encoding", "NormLayer", "resize", "conv_norm_act", "SeparableConv2d",
    # activation checkpointing
    "checkpoint_module", "replay_in_recomputation", "is_recomputing", "enable_checkpointing",
    "disable_checkpointing", "is_checkpointed", "checkpoint_segmentation_model", "CHECKPOINT_POLICIES",
]
