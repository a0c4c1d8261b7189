"""encoding.transforms: PyTorch-Encoding's classification transforms, mapped onto torchvision.

``get_transform(dataset, base_size, crop_size, rand_aug, etrans)`` returns ``(train, val)`` torchvision pipelines for
``"imagenet"``, ``"minc"`` and ``"cifar10"``; ``Lighting`` is AlexNet's PCA colour noise; ``ERandomCrop`` and
``ECenterCrop`` are torchvision's ``RandomResizedCrop`` and ``Resize`` + ``CenterCrop``. torchvision's transforms are
re-exported, as PyTorch-Encoding did. Segmentation transforms live in :mod:`encoding.datasets`.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor, nn
from torchvision.transforms import *  # noqa: F401,F403 - PyTorch-Encoding re-exported torchvision's transforms
from torchvision.transforms import (CenterCrop, ColorJitter, Compose, Normalize, RandAugment, RandomCrop,
                                    RandomHorizontalFlip, RandomResizedCrop, Resize, ToTensor)

from ..datasets import IMAGENET_MEAN, IMAGENET_STD

__all__ = ["get_transform", "Lighting", "ERandomCrop", "ECenterCrop", "IMAGENET_PCA"]

#: Eigenvalues and eigenvectors (columns) of the ImageNet RGB covariance (AlexNet's lighting noise).
IMAGENET_PCA = {
    "eigval": torch.tensor([0.2175, 0.0188, 0.0045]),
    "eigvec": torch.tensor([[-0.5675, 0.7192, 0.4009],
                            [-0.5808, -0.0045, -0.8140],
                            [-0.5836, -0.6948, 0.4203]]),
}
_CIFAR_MEAN, _CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


class Lighting(nn.Module):
    """Add ``eigvec @ (alpha * eigval)`` to every pixel of a ``3 x H x W`` tensor, ``alpha ~ N(0, alphastd)``.

    Args:
        alphastd: standard deviation of the noise (0 disables it).
        eigval: the 3 eigenvalues (default: ImageNet's).
        eigvec: the ``3 x 3`` eigenvectors as columns (default: ImageNet's).
    """

    def __init__(self, alphastd: float, eigval: Optional[Tensor] = None, eigvec: Optional[Tensor] = None) -> None:
        super().__init__()
        self.alphastd = alphastd
        self.eigval = IMAGENET_PCA["eigval"] if eigval is None else torch.as_tensor(eigval)
        self.eigvec = IMAGENET_PCA["eigvec"] if eigvec is None else torch.as_tensor(eigvec)

    def forward(self, img: Tensor) -> Tensor:
        if self.alphastd == 0:
            return img
        alpha = torch.randn(3) * self.alphastd
        rgb = self.eigvec.to(img.dtype) @ (alpha * self.eigval).to(img.dtype)
        return img + rgb.view(3, 1, 1).to(img.device)


def ERandomCrop(crop_size: int) -> RandomResizedCrop:  # noqa: N802 - PyTorch-Encoding's name
    """PyTorch-Encoding's Inception-style random crop: torchvision's ``RandomResizedCrop(crop_size)``."""
    return RandomResizedCrop(crop_size)


def ECenterCrop(crop_size: int, crop_ratio: float = 0.875) -> Compose:  # noqa: N802 - PyTorch-Encoding's name
    """PyTorch-Encoding's evaluation crop: resize the short side to ``crop_size / crop_ratio``, then centre crop."""
    return Compose([Resize(int(crop_size / crop_ratio)), CenterCrop(crop_size)])


def _imagenet(base_size: int, crop_size: int, rand_aug: bool, etrans: bool, lighting: bool
              ) -> Tuple[List[Callable], List[Callable]]:
    train: List[Callable] = [RandAugment(2, 12)] if rand_aug else []
    train.append(ERandomCrop(crop_size) if etrans else RandomResizedCrop(crop_size))
    if lighting:
        train.insert(0, Resize(base_size))
    train += [RandomHorizontalFlip(), ColorJitter(0.4, 0.4, 0.4), ToTensor()]
    train += [Lighting(0.1)] if lighting else []
    val = [ECenterCrop(crop_size)] if etrans else [Resize(base_size), CenterCrop(crop_size)]
    return train + [Normalize(IMAGENET_MEAN, IMAGENET_STD)], val + [ToTensor(), Normalize(IMAGENET_MEAN, IMAGENET_STD)]


def get_transform(dataset: str, base_size: Optional[int] = None, crop_size: int = 224, rand_aug: bool = False,
                  etrans: bool = True, **kwargs: object) -> Tuple[Compose, Compose]:
    """PyTorch-Encoding's ``(transform_train, transform_val)`` for classification datasets.

    Args:
        dataset: ``"imagenet"``, ``"minc"`` (with PCA lighting noise, resize to ``base_size`` first) or
            ``"cifar10"`` (32-pixel crops with 4-pixel padding).
        base_size: resize target of the non-``etrans`` evaluation path (default ``crop_size / 0.875``).
        crop_size: output size.
        rand_aug: prepend torchvision's ``RandAugment(2, 12)`` to the training pipeline.
        etrans: use ``ERandomCrop`` / ``ECenterCrop`` (ImageNet).

    Raises:
        ValueError: for another dataset.
    """
    base_size = base_size if base_size is not None else int(crop_size / 0.875)
    if dataset == "cifar10":
        normalize = Normalize(_CIFAR_MEAN, _CIFAR_STD)
        return (Compose([RandomCrop(32, padding=4), RandomHorizontalFlip(), ToTensor(), normalize]),
                Compose([ToTensor(), normalize]))
    if dataset not in ("imagenet", "minc"):
        raise ValueError(f"get_transform: unknown dataset {dataset!r} (imagenet, minc or cifar10)")
    minc = dataset == "minc"
    train, val = _imagenet(base_size, crop_size, rand_aug, etrans and not minc, lighting=minc)
    return Compose(train), Compose(val)
