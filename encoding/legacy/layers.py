"""Small PyTorch-Encoding layers, each a few lines of torch: ``GlobalAvgPool2d``, ``View``, ``Sum``, ``Mean``,
``Normalize``, ``ConcurrentModule``, ``GramMatrix``, ``DropBlock2D``, ``LabelSmoothing`` and ``EncodingDrop`` (on
:class:`~encoding.nn.Encoding`); and PyTorch-Encoding's later ones: ``UpsampleConv2d``, ``Inspiration``,
``EncodingCosine``, ``ConvBnAct``, ``NLLMultiLabelSmooth``.

Each is declared in ``encoding.nn`` beside its definition (:func:`~encoding.legacy.declare.old_name`;
``docs/migration.md``).
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Union

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

from ..nn.encoding import Encoding
from .declare import old_name

__all__ = ["GlobalAvgPool2d", "View", "Sum", "Mean", "Normalize", "ConcurrentModule", "GramMatrix", "DropBlock2D",
           "LabelSmoothing", "EncodingDrop", "UpsampleConv2d", "Inspiration", "EncodingCosine", "ConvBnAct",
           "NLLMultiLabelSmooth"]


@old_name("encoding.nn")
class GlobalAvgPool2d(nn.Module):
    """``(N, C, H, W)`` -> ``(N, C)``: the spatial mean."""

    def forward(self, x: Tensor) -> Tensor:
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


@old_name("encoding.nn")
class View(nn.Module):
    """``x.view(*size)``; the size may be given as arguments or as one sequence."""

    def __init__(self, *size: Union[int, Sequence[int]]) -> None:
        super().__init__()
        self.size = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)

    def forward(self, x: Tensor) -> Tensor:
        return x.view(self.size)


@old_name("encoding.nn")
class Sum(nn.Module):
    """``x.sum(dim, keepdim=keep_dim)``."""

    def __init__(self, dim: int, keep_dim: bool = False) -> None:
        super().__init__()
        self.dim, self.keep_dim = dim, keep_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.sum(self.dim, keepdim=self.keep_dim)


@old_name("encoding.nn")
class Mean(Sum):
    """``x.mean(dim, keepdim=keep_dim)``."""

    def forward(self, x: Tensor) -> Tensor:
        return x.mean(self.dim, keepdim=self.keep_dim)


@old_name("encoding.nn")
class Normalize(nn.Module):
    """``F.normalize(x, p, dim, eps=1e-8)``: unit ``L_p`` norm along ``dim``."""

    def __init__(self, p: float = 2, dim: int = 1) -> None:
        super().__init__()
        self.p, self.dim = p, dim

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, self.p, self.dim, eps=1e-8)


@old_name("encoding.nn")
class ConcurrentModule(nn.ModuleList):
    """Run every module on the same input and concatenate the outputs along the channels (dim 1)."""

    def __init__(self, modules: Optional[Iterable[nn.Module]] = None) -> None:
        super().__init__(modules)

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([module(x) for module in self], 1)


@old_name("encoding.nn")
class GramMatrix(nn.Module):
    """``(N, C, H, W)`` -> ``(N, C, C)``: feature correlations ``F Fᵀ / (C·H·W)`` (style losses)."""

    def forward(self, x: Tensor) -> Tensor:
        features = x.flatten(2)
        return features @ features.transpose(1, 2) / features[0].numel()


@old_name("encoding.nn")
class DropBlock2D(nn.Module):
    """DropBlock (Ghiasi et al., 2018): in training, zero ``block_size x block_size`` squares and rescale the rest.

    Block centres are drawn with probability ``gamma = drop_prob / block_size² · H·W / ((H - b + 1)(W - b + 1))``,
    so about ``drop_prob`` of the activations are dropped; the survivors are scaled by ``numel / kept`` (the mean is
    kept). PyTorch-Encoding's step schedule (``reset_steps``) is not provided: set ``drop_prob`` directly.

    Args:
        drop_prob: the fraction of activations to drop.
        block_size: side of the dropped squares.
        share_channel: drop the same squares in every channel.
    """

    def __init__(self, drop_prob: float, block_size: int, share_channel: bool = False) -> None:
        super().__init__()
        self.drop_prob, self.block_size, self.share_channel = float(drop_prob), block_size, share_channel

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        n, c, h, w = x.shape
        b = self.block_size
        gamma = self.drop_prob / b ** 2 * (h * w) / ((h - b + 1) * (w - b + 1))
        centres = torch.rand(n, 1 if self.share_channel else c, h, w, device=x.device) < gamma
        dropped = F.max_pool2d(centres.to(x.dtype), b, stride=1, padding=b // 2)[..., :h, :w]
        keep = 1 - dropped
        return x * keep * (keep.numel() / keep.sum().clamp(min=1))

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}, block_size={self.block_size}, share_channel={self.share_channel}"


@old_name("encoding.nn", new="torch.nn.CrossEntropyLoss(label_smoothing=smoothing)")
class LabelSmoothing(nn.CrossEntropyLoss):
    """Cross-entropy against targets smoothed by ``smoothing``: ``(1 - s)·NLL + s·mean_c(-log p_c)``."""

    def __init__(self, smoothing: float = 0.1) -> None:
        super().__init__(label_smoothing=smoothing)


@old_name("encoding.nn")
class EncodingDrop(Encoding):
    """:class:`~encoding.nn.Encoding` whose smoothing factors are redrawn ``U(-1, 0)`` before every training forward
    and set to ``-0.5`` in eval mode (a dropout-like regulariser; the factors are not learned)."""

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            if self.training:
                self.scale.uniform_(-1.0, 0.0)
            else:
                self.scale.fill_(-0.5)
        return super().forward(x)


@old_name("encoding.nn")
class UpsampleConv2d(nn.Module):
    """Upsampling without checkerboard artefacts (MSG-Net): an integer-stride convolution producing
    ``out_channels · scale_factor²`` channels, then ``F.pixel_shuffle(·, scale_factor)``.

    The output is ``out_channels x (scale·H') x (scale·W')`` where ``H' x W'`` is the convolution's output size.
    ``weight`` is ``(out_channels·scale², in_channels / groups, kH, kW)``; weight and bias are drawn
    ``U(±1/√(in_channels·kH·kW))`` as in PyTorch-Encoding.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, scale_factor: int = 1, bias: bool = True) -> None:
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"UpsampleConv2d: in_channels ({in_channels}) and out_channels ({out_channels}) must "
                             f"be divisible by groups ({groups})")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding, self.dilation, self.scale_factor = _pair(padding), _pair(dilation), scale_factor
        channels = out_channels * scale_factor * scale_factor
        self.weight = nn.Parameter(torch.empty(channels, in_channels // groups, *self.kernel_size))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size[0] * self.kernel_size[1])
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        out = F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        return F.pixel_shuffle(out, self.scale_factor)


@old_name("encoding.nn")
class Inspiration(nn.Module):
    """MSG-Net's CoMatch layer: ``Y = (W G)ᵀ X`` on the flattened ``N x C x (H·W)`` input, where ``G`` is the
    target Gram matrix set by :meth:`setTarget` (``B x C x C``, ``B`` = 1 or the batch size) and ``W``
    (``1 x C x C``, initialised ``U(0, 0.02)``) is learned. ``G`` is not saved in the state dict."""

    def __init__(self, C: int, B: int = 1) -> None:
        super().__init__()
        self.C = C
        self.weight = nn.Parameter(torch.empty(1, C, C))
        self.register_buffer("G", torch.zeros(B, C, C), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.weight, 0.0, 0.02)

    def setTarget(self, target: Tensor) -> None:
        """Set the target Gram matrix ``G`` (``B x C x C``), e.g. :class:`GramMatrix` of the style features."""
        self.G = target

    def forward(self, x: Tensor) -> Tensor:
        self.P = torch.bmm(self.weight.expand_as(self.G), self.G)
        n = x.shape[0]
        return torch.bmm(self.P.transpose(1, 2).expand(n, self.C, self.C), x.reshape(n, self.C, -1)).view_as(x)

    def extra_repr(self) -> str:
        return f"N x {self.C}"


@old_name("encoding.nn")
class EncodingCosine(nn.Module):
    """PyTorch-Encoding's experimental encoding layer with dot-product assignments: ``A = softmax_k(x_i · c_k)``,
    ``E_k = Σ_i a_ik (x_i - c_k)``; input ``B x D x N`` or ``B x D x H x W``, output ``B x K x D``; codewords
    ``K x D`` drawn ``U(±1/√(K·D))``."""

    def __init__(self, D: int, K: int) -> None:
        super().__init__()
        self.D, self.K = D, K
        self.codewords = nn.Parameter(torch.empty(K, D))
        self.reset_params()

    def reset_params(self) -> None:
        bound = 1.0 / math.sqrt(self.K * self.D)
        nn.init.uniform_(self.codewords, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() not in (3, 4) or x.shape[1] != self.D:
            raise ValueError(f"EncodingCosine: input must be B x {self.D} x N or B x {self.D} x H x W, got "
                             f"{tuple(x.shape)}")
        from .functions.encoding import aggregate, pairwise_cosine  # PE's functional forms, loaded when used

        x = x.flatten(2).transpose(1, 2)
        assignments = F.softmax(pairwise_cosine(x, self.codewords), dim=2)
        return aggregate(assignments, x, self.codewords)


@old_name("encoding.nn")
class ConvBnAct(nn.Sequential):
    """``conv`` (``nn.Conv2d``), ``bn`` (``norm_layer(out_channels)``) and, with ``act``, ``relu``: PyTorch-Encoding's
    block with the same submodule names. Its split-attention (``radix > 0``) and rectified (``rectify=True``)
    convolutions are not provided (``docs/migration.md``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 radix: int = 0, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 rectify: bool = False, rectify_avg: bool = False, act: bool = True,
                 norm_layer=nn.BatchNorm2d) -> None:
        super().__init__()
        if radix > 0 or rectify:
            raise ValueError(f"ConvBnAct: radix={radix} / rectify={rectify} need SplAtConv2d / RFConv2d, which "
                             "encoding does not provide; use radix=0, rectify=False")
        del rectify_avg
        self.add_module("conv", nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                                          dilation=dilation, groups=groups, bias=bias, padding_mode=padding_mode))
        self.add_module("bn", norm_layer(out_channels))
        if act:
            self.add_module("relu", nn.ReLU())


@old_name("encoding.nn")
class NLLMultiLabelSmooth(nn.Module):
    """Label-smoothed cross-entropy against soft (e.g. mixup) targets. In training, with ``p = log_softmax(x)``
    over the last dimension: ``mean((1 - s)·(-Σ_c t_c p_c) + s·mean_c(-p_c))`` (computed in float32 at least);
    in eval mode ``F.cross_entropy(x, target)``."""

    def __init__(self, smoothing: float = 0.1) -> None:
        super().__init__()
        self.confidence, self.smoothing = 1.0 - smoothing, smoothing

    def forward(self, x: Tensor, target: Tensor) -> Tensor:
        if not self.training:
            return F.cross_entropy(x, target)
        dtype = torch.promote_types(x.dtype, torch.float32)
        logprobs = F.log_softmax(x.to(dtype), dim=-1)
        nll = -(logprobs * target.to(dtype)).sum(-1)
        smooth = -logprobs.mean(dim=-1)
        return (self.confidence * nll + self.smoothing * smooth).mean()
