"""encoding.legacy.functions: PyTorch-Encoding's functional forms, in pure PyTorch (no compiled kernels); PE's
module path ``encoding.functions`` names this package.

* encoding layer: :func:`scaled_l2`, :func:`aggregate`, :func:`pairwise_cosine` (what
  :class:`~encoding.nn.Encoding` computes, as functions);
* BatchNorm statistics and the synchronized BatchNorm: :func:`sum_square`, :func:`moments`,
  :func:`syncbatchnorm`, :func:`inp_syncbatchnorm` (built on :class:`~encoding.nn.SyncBatchNorm`);
* :func:`batchnormtrain` and :func:`NonMaxSuppression` (on ``torchvision.ops.nms``).

See ``docs/migration.md`` for what differs from PyTorch-Encoding.
"""
from .encoding import aggregate, pairwise_cosine, scaled_l2
from .ops import NonMaxSuppression, batchnormtrain
from .syncbn import inp_syncbatchnorm, moments, sum_square, syncbatchnorm

__all__ = ["aggregate", "scaled_l2", "pairwise_cosine", "sum_square", "moments", "syncbatchnorm",
           "inp_syncbatchnorm", "batchnormtrain", "NonMaxSuppression"]
