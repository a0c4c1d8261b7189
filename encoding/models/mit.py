"""Mix Transformer (MiT-B0 ... B5), SegFormer's hierarchical encoder (Xie et al., NeurIPS 2021).

Four stages at strides 4, 8, 16 and 32. Each stage starts with an overlapping patch embedding (a strided conv wider
than its stride, then LayerNorm), runs transformer blocks and ends with a LayerNorm. A block is pre-norm efficient
self-attention, whose keys and values come from the tokens reduced by a strided conv (ratio 8, 4, 2, 1), then a
Mix-FFN (Linear, 3x3 depthwise conv, GELU, Linear) that replaces positional encodings; both branches are residual with
stochastic depth (``drop_path_rate`` rising linearly over the blocks). Attention is
:func:`torch.nn.functional.scaled_dot_product_attention` (flash / memory-efficient kernels where available).

Inside a stage the tokens are kept as ``B x H x W x C`` tensors (contiguous tokens, so the Linear layers and
LayerNorms read them directly, and the spatial size travels with them); the stage outputs are returned as
``B x C x H x W`` views (channels-last memory) like every backbone's.

Weights: no published weights are downloaded; Hugging Face's ``nvidia/mit-b*`` checkpoints are converted from a local
file (:func:`~encoding.models.hf_segformer.convert_hf_segformer`).
"""
from __future__ import annotations

import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import StochasticDepth

from ..errors import UsageError
from ..utils.checkpoint import load_model_state
from .hf_segformer import hf_download_hint, read_segformer_weights
from .weights import Pretrained

__all__ = ["MiTSetting", "MIT_SETTINGS", "OverlapPatchEmbed", "EfficientSelfAttention", "MixFFN", "MiTBlock",
           "MiTStage", "MixTransformer", "get_mit", "min_input_size"]


class MiTSetting(NamedTuple):
    """The shape of one MiT variant (the paper's Table 6); heads (1, 2, 5, 8), reduction ratios (8, 4, 2, 1),
    patch sizes (7, 3, 3, 3), strides (4, 2, 2, 2) and MLP ratio 4 are those of every variant.

    Attributes:
        widths: channels of the four stages.
        depths: blocks of the four stages.
    """

    widths: Tuple[int, int, int, int]
    depths: Tuple[int, int, int, int]


#: Backbone name -> :class:`MiTSetting`.
MIT_SETTINGS: Dict[str, MiTSetting] = {
    "mit_b0": MiTSetting((32, 64, 160, 256), (2, 2, 2, 2)),
    "mit_b1": MiTSetting((64, 128, 320, 512), (2, 2, 2, 2)),
    "mit_b2": MiTSetting((64, 128, 320, 512), (3, 4, 6, 3)),
    "mit_b3": MiTSetting((64, 128, 320, 512), (3, 4, 18, 3)),
    "mit_b4": MiTSetting((64, 128, 320, 512), (3, 8, 27, 3)),
    "mit_b5": MiTSetting((64, 128, 320, 512), (3, 6, 40, 3)),
}
HEADS = (1, 2, 5, 8)
REDUCTIONS = (8, 4, 2, 1)
PATCH_SIZES = (7, 3, 3, 3)
STRIDES = (4, 2, 2, 2)
MLP_RATIO = 4


def min_input_size() -> int:
    """The smallest input side MiT runs on, from :data:`REDUCTIONS`, :data:`PATCH_SIZES` and :data:`STRIDES`: each
    stage needs at least as many tokens per side as its spatial-reduction conv's kernel (29 px: stage 1 reduces
    8 x 8 tokens at stride 4)."""
    needed = 1  # tokens per side after the last stage
    for reduction, patch, stride in reversed(list(zip(REDUCTIONS, PATCH_SIZES, STRIDES))):
        # the fewest pixels (or tokens) an OverlapPatchEmbed (padding patch // 2) turns into max(needed, reduction)
        needed = max((max(needed, reduction) - 1) * stride + patch - 2 * (patch // 2), 1)
    return needed


def _channels_first(x: Tensor) -> Tensor:
    """``B x H x W x C`` tokens as a ``B x C x H x W`` view (channels-last memory)."""
    return x.permute(0, 3, 1, 2)


def _channels_last(x: Tensor) -> Tensor:
    """``B x C x H x W`` as ``B x H x W x C`` (a view of channels-last memory)."""
    return x.permute(0, 2, 3, 1)


class OverlapPatchEmbed(nn.Module):
    """Overlapping patch embedding: ``Conv2d(kernel=patch, stride, padding=patch // 2)`` then LayerNorm.

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x H' x W' x width`` tokens (``H' = ceil(H / stride)``).
    """

    def __init__(self, in_channels: int, width: int, patch_size: int, stride: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_channels, width, patch_size, stride, patch_size // 2)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(_channels_last(self.proj(x)))


class EfficientSelfAttention(nn.Module):
    """Multi-head self-attention whose keys and values come from the tokens reduced ``reduction`` times per side
    (a ``reduction`` x ``reduction`` strided conv, then LayerNorm).

    Args:
        width: token channels.
        heads: attention heads (``width`` divisible by it).
        reduction: spatial reduction ratio of keys and values (1: none).

    Shape:
        ``B x H x W x width`` -> same.
    """

    def __init__(self, width: int, heads: int, reduction: int) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.kv = nn.Linear(width, 2 * width)
        self.sr = nn.Conv2d(width, width, reduction, reduction) if reduction > 1 else None
        self.sr_norm = nn.LayerNorm(width) if reduction > 1 else None
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        b, h, w, c = x.shape
        d = c // self.heads
        q = self.q(x).reshape(b, h * w, self.heads, d).transpose(1, 2)
        source = x
        if self.sr is not None:
            source = self.sr_norm(_channels_last(self.sr(_channels_first(x))))
        kv = self.kv(source).reshape(b, -1, 2, self.heads, d).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, kv[0], kv[1])
        return self.proj(out.transpose(1, 2).reshape(b, h, w, c))


class MixFFN(nn.Module):
    """Mix-FFN: Linear to ``hidden`` channels, 3x3 depthwise conv, GELU, Linear back.

    Shape:
        ``B x H x W x width`` -> same.
    """

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: Tensor) -> Tensor:
        x = _channels_last(self.dwconv(_channels_first(self.fc1(x))))
        return self.fc2(self.act(x))


class MiTBlock(nn.Module):
    """Pre-norm transformer block: ``x + drop(attn(norm1(x)))``, then ``x + drop(ffn(norm2(x)))``.

    Args:
        width: token channels.
        heads: attention heads.
        reduction: key/value spatial reduction ratio.
        drop_path: stochastic-depth probability of both branches (per sample).

    Shape:
        ``B x H x W x width`` -> same.
    """

    def __init__(self, width: int, heads: int, reduction: int, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = EfficientSelfAttention(width, heads, reduction)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = MixFFN(width, width * MLP_RATIO)
        self.drop_path = StochasticDepth(drop_path, "row")

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class MiTStage(nn.Module):
    """One encoder stage: :class:`OverlapPatchEmbed`, the :class:`MiTBlock` s (``blocks``), LayerNorm.

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x width x H' x W'`` (a channels-last view).
    """

    def __init__(self, in_channels: int, width: int, depth: int, index: int, drop_paths: Sequence[float]) -> None:
        super().__init__()
        self.patch_embed = OverlapPatchEmbed(in_channels, width, PATCH_SIZES[index], STRIDES[index])
        self.blocks = nn.Sequential(*(MiTBlock(width, HEADS[index], REDUCTIONS[index], p) for p in drop_paths))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: Tensor) -> Tensor:
        return _channels_first(self.norm(self.blocks(self.patch_embed(x))))


class MixTransformer(nn.Module):
    """The MiT encoder: four :class:`MiTStage` s (``layers``), returning every stage's output.

    Args:
        setting: the variant's widths and depths (:data:`MIT_SETTINGS`).
        drop_path_rate: stochastic depth of the last block (linear from 0 over all blocks; the paper's 0.1).
        name: how errors name the network (``mit_b0`` ...).

    Attributes:
        channels: output channels of ``(c1, c2, c3, c4)``.
        output_stride: 32.
        min_size: the smallest input side (:func:`min_input_size`).

    Shape:
        - Input: ``B x 3 x H x W``, ``H`` and ``W`` at least ``min_size`` (29).
        - Output: list ``[c1, c2, c3, c4]`` at strides 4, 8, 16, 32 (channels-last views).

    Raises:
        UsageError: (a ``ValueError``, in ``forward``) an input side below ``min_size``, naming the network, the
            minimum and the size given.
    """

    output_stride = 32

    def __init__(self, setting: MiTSetting, drop_path_rate: float = 0.1, name: str = "MiT") -> None:
        super().__init__()
        self.name, self.min_size = name, min_input_size()
        total = sum(setting.depths)
        rates = [drop_path_rate * i / max(total - 1, 1) for i in range(total)]
        layers, start = [], 0
        for index, (width, depth) in enumerate(zip(setting.widths, setting.depths)):
            in_channels = setting.widths[index - 1] if index else 3
            layers.append(MiTStage(in_channels, width, depth, index, rates[start:start + depth]))
            start += depth
        self.layers = nn.ModuleList(layers)
        self.channels = tuple(setting.widths)

    def stages(self) -> Tuple[nn.Sequential, ...]:
        """The blocks of each stage (the residual blocks that ``recompute="backbone"`` recomputes)."""
        return tuple(layer.blocks for layer in self.layers)

    def forward(self, x: Tensor) -> List[Tensor]:
        self._check_size(x)
        features = []
        for layer in self.layers:
            x = layer(x)
            features.append(x)
        return features


    def _check_size(self, x: Tensor) -> None:
        """Refuse (before any conv) an input with a side below :attr:`min_size`, naming the network."""
        height, width = x.shape[-2:]
        if height < self.min_size or width < self.min_size:
            raise UsageError(
                f"{self.name} needs inputs of at least {self.min_size} x {self.min_size} pixels, got {height} x "
                f"{width} (SegFormer's Mix Transformer: stage 1 reduces its keys and values with a conv over "
                f"{REDUCTIONS[0]} x {REDUCTIONS[0]} tokens, each of stride {STRIDES[0]}); use larger images, crops or "
                "windows")


def get_mit(name: str, output_stride: Optional[int] = None, pretrained: Pretrained = False) -> MixTransformer:
    """Build the MiT encoder ``name`` (``mit_b0`` ... ``mit_b5``).

    Args:
        name: a key of :data:`MIT_SETTINGS`.
        output_stride: ``None`` or 32 (MiT is not dilated).
        pretrained: ``False``, or a local file: Hugging Face's ``nvidia/mit-b*`` (``pytorch_model.bin`` or
            ``model.safetensors``, converted) or this encoder's own state dict. ``True`` raises: nothing downloads.

    Raises:
        ValueError: unknown name, another output stride, or ``pretrained=True`` (the message names the checkpoint
            to download).
    """
    if name not in MIT_SETTINGS:
        raise ValueError(f"unknown MiT backbone {name!r}; valid: {', '.join(MIT_SETTINGS)}")
    if output_stride not in (None, 32):
        raise ValueError(f"{name} has output stride 32 only (MiT is not dilated), got output_stride={output_stride}")
    if pretrained is True:
        raise ValueError(hf_download_hint(name))
    backbone = MixTransformer(MIT_SETTINGS[name], name=name)
    if pretrained:
        state = read_segformer_weights(pretrained)
        if any(k.startswith("backbone.") for k in state):  # a whole model's weights: keep the encoder's
            state = {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}
        load_model_state(backbone, state, source=repr(os.fspath(pretrained)))
    return backbone
