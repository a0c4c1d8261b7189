"""PyTorch-Encoding's module path ``encoding.functions``: its functional forms, which live in
:mod:`encoding.legacy.functions` (imported when this module is; ``import encoding`` does not import it)."""
import warnings

from .legacy.functions import (NonMaxSuppression, aggregate, batchnormtrain, inp_syncbatchnorm, moments,
                               pairwise_cosine, scaled_l2, sum_square, syncbatchnorm)

__all__ = ["aggregate", "scaled_l2", "pairwise_cosine", "sum_square", "moments", "syncbatchnorm",
           "inp_syncbatchnorm", "batchnormtrain", "NonMaxSuppression"]

warnings.warn("encoding.functions is PyTorch-Encoding's module path; use encoding.legacy.functions", FutureWarning,
              stacklevel=2)
