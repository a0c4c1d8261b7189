"""PyTorch-Encoding's module path ``encoding.transforms``: its classification transforms (``get_transform``,
``Lighting``, ``ERandomCrop``, ``ECenterCrop``), which live in :mod:`encoding.legacy.transforms`, and torchvision's
transforms re-exported, as PyTorch-Encoding did.

``import encoding`` imports this module, as PyTorch-Encoding's did (``encoding.transforms`` is an attribute after a
bare ``import encoding``). It is cheap: torchvision's transforms are loaded by the datasets already.
"""
from torchvision.transforms import *  # noqa: F401,F403 - PyTorch-Encoding re-exported torchvision's transforms
from .legacy.transforms import IMAGENET_PCA, ECenterCrop, ERandomCrop, Lighting, get_transform

__all__ = ["get_transform", "Lighting", "ERandomCrop", "ECenterCrop", "IMAGENET_PCA"]
