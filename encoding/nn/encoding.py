"""The residual-encoding layer of "Deep TEN" (Zhang et al., CVPR 2017) and "Context Encoding" (CVPR 2018).

Pure PyTorch: the assignment weights and the aggregated residuals are computed with matrix products, so the
``B x N x K x D`` tensor of all residuals ``x_i - c_k`` is never materialized (memory ``O(B·N·K + B·N·D)``).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["Encoding"]


class Encoding(nn.Module):
    r"""Residual encoding layer: soft-assigns every feature to ``K`` learned codewords and aggregates the residuals.

    With features :math:`x_i \in \mathbb{R}^D` (``i = 1..N``, the spatial positions), codewords
    :math:`c_k \in \mathbb{R}^D` and smoothing factors :math:`s_k` (``k = 1..K``):

    .. math::
        a_{ik} = \frac{\exp(s_k \lVert x_i - c_k \rVert^2)}{\sum_{j} \exp(s_j \lVert x_i - c_j \rVert^2)}, \qquad
        e_k = \sum_{i} a_{ik} (x_i - c_k)

    The squared distances are expanded as ``|x|² - 2 x·c + |c|²`` and ``e_k = (Aᵀ X)_k - (Σ_i a_ik) c_k``.

    Args:
        D: feature dimension (channels of the input).
        K: number of codewords.

    Shape:
        - Input: ``B x D x H x W`` or ``B x D x N``.
        - Output: ``B x K x D``.

    Attributes:
        codewords: ``K x D`` learnable codewords, initialised ``U(-1/sqrt(K·D), 1/sqrt(K·D))``.
        scale: ``K`` learnable smoothing factors, initialised ``U(-1, 0)``.

    Example:
        >>> layer = Encoding(D=64, K=32)
        >>> layer(torch.randn(2, 64, 8, 8)).shape
        torch.Size([2, 32, 64])
    """

    def __init__(self, D: int, K: int) -> None:
        super().__init__()
        if D <= 0 or K <= 0:
            raise ValueError(f"Encoding needs positive D and K, got D={D}, K={K}")
        self.D, self.K = D, K
        self.codewords = nn.Parameter(torch.empty(K, D))
        self.scale = nn.Parameter(torch.empty(K))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-draw the codewords and smoothing factors from their initial distributions."""
        bound = 1.0 / math.sqrt(self.K * self.D)
        with torch.no_grad():
            self.codewords.uniform_(-bound, bound)
            self.scale.uniform_(-1.0, 0.0)

    def reset_params(self) -> None:
        """PyTorch-Encoding's name of :meth:`reset_parameters`."""
        self.reset_parameters()

    def assignment(self, x: Tensor) -> Tensor:
        """Soft-assignment weights ``A`` (softmax over codewords of the scaled squared distances).

        Args:
            x: features as ``B x N x D``.

        Returns:
            ``B x N x K`` weights summing to one over ``K``.
        """
        codewords = self.codewords.to(x.dtype)
        dist = (x * x).sum(-1, keepdim=True) - 2.0 * x @ codewords.t() + (codewords * codewords).sum(-1)
        return torch.softmax(dist * self.scale.to(x.dtype), dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() not in (3, 4) or x.shape[1] != self.D:
            raise ValueError(f"Encoding(D={self.D}) expects input B x {self.D} x H x W or B x {self.D} x N, "
                             f"got shape {tuple(x.shape)}")
        x = x.flatten(2).transpose(1, 2)  # B x N x D
        weights = self.assignment(x)  # B x N x K
        codewords = self.codewords.to(x.dtype)
        return weights.transpose(1, 2) @ x - weights.sum(1).unsqueeze(-1) * codewords

    def extra_repr(self) -> str:
        return f"D={self.D}, K={self.K}"
