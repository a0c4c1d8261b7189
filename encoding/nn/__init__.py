"""encoding.nn: synchronized BatchNorm, the Encoding layer, small generic blocks and the losses (pure PyTorch).

PyTorch-Encoding's, vacancy's and mmcv's names are declared for this module beside their objects and bound here when
``encoding`` is imported (not part of ``__all__``): ``BatchNorm1d/2d/3d``, ``SynchronizedBatchNorm*``,
``convert_model``, ``patch_sync_batchnorm``, ``revert_sync_batchnorm``, ``set_sbn_eps_mode`` in
``encoding/legacy/batchnorm.py``; ``GlobalAvgPool2d``, ``View``, ... ``EncodingDrop`` in ``encoding/legacy/layers.py``;
``DistSyncBatchNorm`` and the heads ``FCNHead`` / ``PSPHead`` / ... (which live in ``encoding.models``) in
``encoding/legacy/aliases.py``. A name with a new spelling warns (``FutureWarning``) when used.
Every loss is :mod:`encoding.nn.loss`'s (one module per loss family): ``SegmentationLosses`` / ``OhemCrossEntropy``
(one class each, taking ``(output_dict_or_tensor, target)`` and PyTorch-Encoding's argument layouts), Dice, Focal,
Lovász-Softmax and ``LOSSES``, the registry of ``train.py --loss``; ``encoding.nn.losses`` is its old path
(``encoding/legacy/aliases.py``). The binary (one-channel) losses are :mod:`encoding.nn.binary`'s.
"""
from . import binary, blocks, encoding, loss, recompute, syncbn
from .blocks import NormLayer, SeparableConv2d, conv_norm_act, resize
from .encoding import Encoding
from .binary import BINARY_LOSSES, BinaryBCELoss, BinaryDiceLoss, BinaryFocalLoss
from .loss import LOSSES, DiceLoss, FocalLoss, LovaszSoftmaxLoss, OhemCrossEntropy, SegmentationLosses
from .recompute import (RECOMPUTE_POLICIES, checkpoint_module, checkpoint_segmentation_model, disable_checkpointing,
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
    "disable_checkpointing", "is_checkpointed", "checkpoint_segmentation_model", "RECOMPUTE_POLICIES",
]
