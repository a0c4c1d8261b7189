"""PyTorch-Encoding's module path ``encoding.functions``: its functional forms (``aggregate``, ``scaled_l2``,
``moments``, ``sum_square``, ``syncbatchnorm``, ``NonMaxSuppression``...), which live in
:mod:`encoding.legacy.functions`.

``import encoding`` imports this module, as PyTorch-Encoding's did, so ``encoding.functions.aggregate(...)`` works
after a bare ``import encoding``. It is cheap: pure-PyTorch functions on torch and torchvision, which the package
has loaded already.
"""
from .legacy.functions import (NonMaxSuppression, aggregate, batchnormtrain, inp_syncbatchnorm, moments,
                               pairwise_cosine, scaled_l2, sum_square, syncbatchnorm)

__all__ = ["aggregate", "scaled_l2", "pairwise_cosine", "sum_square", "moments", "syncbatchnorm",
           "inp_syncbatchnorm", "batchnormtrain", "NonMaxSuppression"]
