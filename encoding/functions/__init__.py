"""encoding.functions: PyTorch-Encoding's functional forms, in pure PyTorch (no compiled kernels).

* encoding layer: :func:`scaled_l2`, :func:`aggregate`, :func:`pairwise_cosine` (what
  :class:`~encoding.nn.Encoding` computes, as functions);
* BatchNorm statistics and the synchronized BatchNorm: :func:`sum_square`, :func:`moments`,
  :func:`syncbatchnorm`, :func:`inp_syncbatchnorm` (built on :class:`~encoding.nn.SyncBatchNorm`).

See ``docs/migration.md`` for what differs from PyTorch-Encoding.
"""
from .encoding import aggregate, pairwise_cosine, scaled_l2
from .syncbn import inp_syncbatchnorm, moments, sum_square, syncbatchnorm

__all__ = ["aggregate", "scaled_l2", "pairwise_cosine", "sum_square", "moments", "syncbatchnorm",
           "inp_syncbatchnorm"]
