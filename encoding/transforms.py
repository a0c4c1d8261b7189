"""PyTorch-Encoding's module path ``encoding.transforms``: its classification transforms, which live in
:mod:`encoding.legacy.transforms` (imported when this module is; ``import encoding`` does not import it)."""
import warnings

from torchvision.transforms import *  # noqa: F401,F403 - PyTorch-Encoding re-exported torchvision's transforms
from .legacy.transforms import IMAGENET_PCA, ECenterCrop, ERandomCrop, Lighting, get_transform

__all__ = ["get_transform", "Lighting", "ERandomCrop", "ECenterCrop", "IMAGENET_PCA"]

warnings.warn("encoding.transforms is PyTorch-Encoding's module path; use encoding.legacy.transforms", FutureWarning,
              stacklevel=2)
