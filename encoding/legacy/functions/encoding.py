"""The two steps of the residual-encoding layer as functions (PyTorch-Encoding's ``scaled_l2`` and ``aggregate``).

Both expand the residuals ``x_i - c_k`` into matrix products, so the ``B x N x K x D`` residual tensor is never
built; autograd differentiates them.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["scaled_l2", "aggregate", "pairwise_cosine"]


def scaled_l2(X: Tensor, C: Tensor, S: Tensor) -> Tensor:
    r"""Scaled squared distances :math:`sl_{ik} = s_k \lVert x_i - c_k \rVert^2`.

    Args:
        X: features ``B x N x D``.
        C: codewords ``K x D``.
        S: smoothing factors ``K``.

    Returns:
        ``B x N x K``.
    """
    C = C.to(X.dtype)
    distances = (X * X).sum(-1, keepdim=True) - 2.0 * X @ C.t() + (C * C).sum(-1)
    return distances * S.to(X.dtype)


def aggregate(A: Tensor, X: Tensor, C: Tensor) -> Tensor:
    r"""Aggregated residuals :math:`e_k = \sum_i a_{ik} (x_i - c_k)`.

    Args:
        A: assignment weights ``B x N x K``.
        X: features ``B x N x D``.
        C: codewords ``K x D``.

    Returns:
        ``B x K x D``.
    """
    return A.transpose(1, 2) @ X - A.sum(1).unsqueeze(-1) * C.to(X.dtype)


def pairwise_cosine(X: Tensor, C: Tensor, normalize: bool = False) -> Tensor:
    """Dot products ``X Cᵀ`` of features ``B x N x D`` and codewords ``K x D`` (cosines with ``normalize=True``).

    Returns:
        ``B x N x K``.
    """
    if normalize:
        X, C = F.normalize(X, dim=2, eps=1e-8), F.normalize(C, dim=1, eps=1e-8)
    return X @ C.t()
