"""Blocks and segmentation heads (names as in PyTorch-Encoding), all with a configurable ``norm_layer``.

Blocks: :class:`PyramidPooling` (PSPNet), :class:`ASPP` (DeepLabV3), :class:`EncModule` (EncNet),
:class:`JPU` / :class:`SeparableConv2d` (FastFCN), :class:`PAM` / :class:`CAM` (DANet).
Heads (feature maps in, class logits out): :class:`FCNHead`, :class:`PSPHead`, :class:`DeepLabV3Head`,
:class:`EncHead`, :class:`DANetHead`, :class:`FPNHead` (FCFPN, and UperNet with ``pyramid_pooling=True``).

``norm_layer`` is any callable ``norm_layer(num_features) -> nn.Module`` accepting ``B x C x H x W`` input, such as
``nn.BatchNorm2d`` (the default) or ``encoding.nn.SyncBatchNorm``.

:class:`FCNHead` and :class:`DeepLabV3Head` have the module layout of torchvision's ``FCNHead`` / ``DeepLabHead``, so
their state dicts are interchangeable.
"""
from __future__ import annotations

from typing import Callable, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .encoding import Encoding

__all__ = ["FCNHead", "PyramidPooling", "PSPHead", "ASPP", "DeepLabV3Head", "EncModule", "EncHead",
           "SeparableConv2d", "JPU", "PAM", "CAM", "DANetHead", "FPNHead"]

NormLayer = Callable[[int], nn.Module]


def resize(x: Tensor, size: Sequence[int]) -> Tensor:
    """Bilinear resize of ``B x C x H x W`` to ``size`` (``align_corners=False``); a no-op at the same size."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)


def conv_norm_act(in_channels: int, out_channels: int, kernel_size: int = 3, norm_layer: NormLayer = nn.BatchNorm2d,
                  dilation: int = 1) -> nn.Sequential:
    """``Conv2d`` (no bias, "same" padding) → ``norm_layer`` → ``ReLU``, as ``nn.Sequential`` (keys ``0``, ``1``)."""
    padding = dilation * (kernel_size // 2)
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, dilation=dilation, bias=False),
        norm_layer(out_channels),
        nn.ReLU(inplace=True),
    )


class FCNHead(nn.Sequential):
    """FCN head: 3x3 conv to ``in_channels // 4``, norm, ReLU, dropout, 1x1 conv to the classes.

    Same layout (and state-dict keys ``0.weight``, ``1.*``, ``4.*``) as torchvision's ``FCNHead``. Also used as the
    auxiliary head of every model.

    Args:
        in_channels: channels of the input feature map.
        out_channels: number of classes.
        norm_layer: normalization layer class.
        dropout: dropout probability before the classifier.

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d,
                 dropout: float = 0.1) -> None:
        inter = in_channels // 4
        super().__init__(*conv_norm_act(in_channels, inter, 3, norm_layer), nn.Dropout(dropout),
                         nn.Conv2d(inter, out_channels, 1))


class PyramidPooling(nn.Module):
    """PSPNet pyramid pooling: average-pool to ``bins`` grids, 1x1 conv, upsample, concatenate with the input.

    Args:
        in_channels: channels of the input.
        norm_layer: normalization layer class.
        bins: output grid sizes of the pooling branches.

    Shape:
        - Input: ``B x C x H x W``.
        - Output: ``B x (C + len(bins) * (C // len(bins))) x H x W`` (``2C`` with the default four bins); the first
          ``C`` channels are the input itself.
    """

    def __init__(self, in_channels: int, norm_layer: NormLayer = nn.BatchNorm2d,
                 bins: Sequence[int] = (1, 2, 3, 6)) -> None:
        super().__init__()
        branch_channels = in_channels // len(bins)
        self.branches = nn.ModuleList(
            nn.Sequential(nn.AdaptiveAvgPool2d(b), *conv_norm_act(in_channels, branch_channels, 1, norm_layer))
            for b in bins)
        self.out_channels = in_channels + len(bins) * branch_channels

    def forward(self, x: Tensor) -> Tensor:
        size = x.shape[-2:]
        return torch.cat([x] + [resize(branch(x), size) for branch in self.branches], dim=1)


class PSPHead(nn.Sequential):
    """PSPNet head: :class:`PyramidPooling`, 3x3 conv to ``in_channels // 4``, norm, ReLU, dropout, 1x1 classifier.

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        pool = PyramidPooling(in_channels, norm_layer)
        inter = in_channels // 4
        super().__init__(pool, *conv_norm_act(pool.out_channels, inter, 3, norm_layer), nn.Dropout(0.1),
                         nn.Conv2d(inter, out_channels, 1))


class _ImagePooling(nn.Sequential):
    """ASPP image-level branch: global average pool, 1x1 conv, norm, ReLU, upsampled back to the input size
    (bilinear like torchvision, so outputs match it bit for bit)."""

    def __init__(self, in_channels: int, out_channels: int, norm_layer: NormLayer) -> None:
        super().__init__(nn.AdaptiveAvgPool2d(1), *conv_norm_act(in_channels, out_channels, 1, norm_layer))

    def forward(self, x: Tensor) -> Tensor:
        return resize(super().forward(x), x.shape[-2:])


class ASPP(nn.Module):
    """Atrous spatial pyramid pooling (DeepLabV3): a 1x1 branch, one 3x3 branch per rate, image pooling, projection.

    Same layout as torchvision's ``ASPP`` (``convs``: 1x1, the atrous branches, pooling; ``project``: 1x1 conv,
    norm, ReLU, dropout 0.5).

    Args:
        in_channels: channels of the input.
        atrous_rates: dilation of each 3x3 branch ((12, 24, 36) at output stride 8).
        out_channels: channels of every branch and of the output.
        norm_layer: normalization layer class.

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, atrous_rates: Sequence[int] = (12, 24, 36), out_channels: int = 256,
                 norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        super().__init__()
        branches = [conv_norm_act(in_channels, out_channels, 1, norm_layer)]
        branches += [conv_norm_act(in_channels, out_channels, 3, norm_layer, dilation=r) for r in atrous_rates]
        branches.append(_ImagePooling(in_channels, out_channels, norm_layer))
        self.convs = nn.ModuleList(branches)
        self.project = nn.Sequential(*conv_norm_act(len(branches) * out_channels, out_channels, 1, norm_layer),
                                     nn.Dropout(0.5))

    def forward(self, x: Tensor) -> Tensor:
        return self.project(torch.cat([branch(x) for branch in self.convs], dim=1))


class DeepLabV3Head(nn.Sequential):
    """DeepLabV3 head: :class:`ASPP` (256 channels), 3x3 conv, norm, ReLU, 1x1 classifier.

    Same layout as torchvision's ``DeepLabHead``.

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, out_channels: int, atrous_rates: Sequence[int] = (12, 24, 36),
                 norm_layer: NormLayer = nn.BatchNorm2d, channels: int = 256) -> None:
        super().__init__(ASPP(in_channels, atrous_rates, channels, norm_layer),
                         *conv_norm_act(channels, channels, 3, norm_layer), nn.Conv2d(channels, out_channels, 1))


class EncModule(nn.Module):
    """Context encoding module (EncNet): channel attention from an :class:`Encoding` of the feature map.

    ``e = mean_k ReLU(norm(Encoding(ReLU(norm(conv1x1(x))))))``, ``gamma = sigmoid(fc(e))``,
    ``out = ReLU(x + x * gamma)``; with ``se_loss`` also ``se = Linear(e)``, the logits of "class present in the
    image" for the semantic-encoding loss.

    Args:
        in_channels: channels ``C`` of the input (also the codeword dimension).
        nclass: number of classes (SE-loss logits).
        ncodes: number of codewords ``K``.
        se_loss: also return the SE logits.
        norm_layer: normalization layer class (applied to the ``B x K x D`` encoding as ``B x K x D x 1``).

    Shape:
        - Input: ``B x C x H x W``.
        - Output: ``B x C x H x W``, or the tuple ``(B x C x H x W, B x nclass)`` when ``se_loss``.
    """

    def __init__(self, in_channels: int, nclass: int, ncodes: int = 32, se_loss: bool = True,
                 norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        super().__init__()
        self.encoding = nn.Sequential(*conv_norm_act(in_channels, in_channels, 1, norm_layer),
                                      Encoding(D=in_channels, K=ncodes))
        self.codeword_norm = norm_layer(ncodes)
        self.fc = nn.Sequential(nn.Linear(in_channels, in_channels), nn.Sigmoid())
        self.selayer = nn.Linear(in_channels, nclass) if se_loss else None

    def forward(self, x: Tensor) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        encoded = self.codeword_norm(self.encoding(x).unsqueeze(-1)).squeeze(-1)  # B x K x C
        encoded = F.relu(encoded).mean(dim=1)  # B x C
        gamma = self.fc(encoded)[:, :, None, None]
        out = F.relu(x + x * gamma)
        if self.selayer is None:
            return out
        return out, self.selayer(encoded)


class EncHead(nn.Module):
    """EncNet head: 3x3 conv to ``width``, optional lateral fusion of c2/c3, :class:`EncModule`, dropout, classifier.

    Args:
        in_channels: channels of the last feature map (c4).
        out_channels: number of classes.
        se_loss: also return the SE-loss logits.
        lateral: fuse 1x1-projected c2 and c3 with c4 (the "lateral" multi-level variant); then ``forward`` needs
            ``(c2, c3, c4)``.
        lateral_channels: channels of c2 and c3 (needed with ``lateral``).
        width: channels inside the head.
        ncodes: codewords of the :class:`Encoding` layer.
        norm_layer: normalization layer class.

    Shape:
        - Input: ``*features`` whose last element is ``B x in_channels x H x W`` (with ``lateral``: c2, c3, c4).
        - Output: ``B x out_channels x H x W``, or ``(that, B x out_channels)`` when ``se_loss``.
    """

    def __init__(self, in_channels: int, out_channels: int, se_loss: bool = True, lateral: bool = False,
                 lateral_channels: Sequence[int] = (512, 1024), width: int = 512, ncodes: int = 32,
                 norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        super().__init__()
        self.conv5 = conv_norm_act(in_channels, width, 3, norm_layer)
        self.lateral = lateral
        if lateral:
            self.connect = nn.ModuleList(conv_norm_act(c, width, 1, norm_layer) for c in lateral_channels)
            self.fusion = conv_norm_act((len(lateral_channels) + 1) * width, width, 3, norm_layer)
        self.encmodule = EncModule(width, out_channels, ncodes=ncodes, se_loss=se_loss, norm_layer=norm_layer)
        self.conv6 = nn.Sequential(nn.Dropout(0.1), nn.Conv2d(width, out_channels, 1))

    def forward(self, *features: Tensor) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        x = self.conv5(features[-1])
        if self.lateral:
            inputs = features[-1 - len(self.connect):-1]
            if len(inputs) != len(self.connect):
                raise ValueError(f"EncHead(lateral=True) needs {len(self.connect) + 1} feature maps, "
                                 f"got {len(features)}")
            laterals = [resize(conv(f), x.shape[-2:]) for conv, f in zip(self.connect, inputs)]
            x = self.fusion(torch.cat([x] + laterals, dim=1))
        out = self.encmodule(x)
        if isinstance(out, tuple):
            return self.conv6(out[0]), out[1]
        return self.conv6(out)


class SeparableConv2d(nn.Sequential):
    """Depthwise conv → norm → pointwise 1x1 conv (FastFCN's separable convolution).

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H' x W'``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1,
                 dilation: int = 1, bias: bool = False, norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        padding = dilation * (kernel_size // 2)
        super().__init__(
            nn.Conv2d(in_channels, in_channels, kernel_size, stride, padding, dilation, groups=in_channels,
                      bias=bias),
            norm_layer(in_channels),
            nn.Conv2d(in_channels, out_channels, 1, bias=bias),
        )


class JPU(nn.Module):
    """Joint pyramid upsampling (FastFCN): turns the stride-8/16/32 stages of a non-dilated backbone into one
    stride-8 feature map, replacing dilated convolutions.

    The last three inputs (c2, c3, c4) are each projected to ``width`` channels, upsampled to c2's size,
    concatenated and passed through four parallel separable convolutions with dilations 1, 2, 4, 8.

    Args:
        in_channels: channels of (c2, c3, c4).
        width: channels of each projection and dilation branch.
        norm_layer: normalization layer class.
        dilations: dilations of the parallel branches.

    Shape:
        - Input: ``*features`` (e.g. c1, c2, c3, c4), the last three with ``in_channels`` channels.
        - Output: the same tuple with the last element replaced by ``B x (len(dilations) * width) x H2 x W2``
          (``H2 x W2`` the size of c2).
    """

    def __init__(self, in_channels: Sequence[int] = (512, 1024, 2048), width: int = 512,
                 norm_layer: NormLayer = nn.BatchNorm2d, dilations: Sequence[int] = (1, 2, 4, 8)) -> None:
        super().__init__()
        self.projections = nn.ModuleList(conv_norm_act(c, width, 3, norm_layer) for c in in_channels)
        self.dilations = nn.ModuleList(
            nn.Sequential(SeparableConv2d(len(in_channels) * width, width, 3, dilation=d, norm_layer=norm_layer),
                          norm_layer(width), nn.ReLU(inplace=True))
            for d in dilations)
        self.out_channels = len(dilations) * width

    def forward(self, *features: Tensor) -> Tuple[Tensor, ...]:
        n = len(self.projections)
        if len(features) < n:
            raise ValueError(f"JPU needs at least {n} feature maps, got {len(features)}")
        inputs = features[-n:]
        size = inputs[0].shape[-2:]
        feat = torch.cat([resize(proj(f), size) for proj, f in zip(self.projections, inputs)], dim=1)
        feat = torch.cat([branch(feat) for branch in self.dilations], dim=1)
        return (*features[:-1], feat)


class PAM(nn.Module):
    """Position attention module (DANet): every position attends to every other position.

    ``out = gamma * V softmax(Qᵀ K)ᵀ + x`` with 1x1-conv projections ``Q, K`` (``C // reduction`` channels) and
    ``V`` (``C`` channels) and a learnable scalar ``gamma`` initialised to 0. Computed with
    ``scaled_dot_product_attention`` (scale 1), so memory-efficient kernels are used where available.

    Shape:
        - Input: ``B x C x H x W``.
        - Output: ``B x C x H x W``.
    """

    def __init__(self, in_channels: int, reduction: int = 8) -> None:
        super().__init__()
        inter = max(in_channels // reduction, 1)
        self.query_conv = nn.Conv2d(in_channels, inter, 1)
        self.key_conv = nn.Conv2d(in_channels, inter, 1)
        self.value_conv = nn.Conv2d(in_channels, in_channels, 1)
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        query = self.query_conv(x).flatten(2).transpose(1, 2).unsqueeze(1)  # B x 1 x N x C'
        key = self.key_conv(x).flatten(2).transpose(1, 2).unsqueeze(1)
        value = self.value_conv(x).flatten(2).transpose(1, 2).unsqueeze(1)  # B x 1 x N x C
        out = F.scaled_dot_product_attention(query, key, value, scale=1.0)
        return self.gamma * out.squeeze(1).transpose(1, 2).reshape(b, c, h, w) + x


class CAM(nn.Module):
    """Channel attention module (DANet): every channel attends to every other channel.

    ``energy = X Xᵀ`` (``C x C``), ``attention = softmax(max(energy) - energy)`` (= ``softmax(-energy)``),
    ``out = gamma * attention X + x`` with a learnable scalar ``gamma`` initialised to 0.

    Shape:
        - Input: ``B x C x H x W``.
        - Output: ``B x C x H x W``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: Tensor) -> Tensor:
        flat = x.flatten(2)  # B x C x N
        attention = torch.softmax(-(flat @ flat.transpose(1, 2)), dim=-1)
        return self.gamma * (attention @ flat).view_as(x) + x


class DANetHead(nn.Module):
    """DANet head: parallel :class:`PAM` and :class:`CAM` branches (each 3x3 conv → attention → 3x3 conv), summed,
    dropout, 1x1 classifier.

    Only the fused output is produced (every parameter contributes to it, as DDP requires).

    Shape:
        - Input: ``B x in_channels x H x W``.
        - Output: ``B x out_channels x H x W``.
    """

    def __init__(self, in_channels: int, out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        super().__init__()
        inter = in_channels // 4
        self.position = nn.Sequential(conv_norm_act(in_channels, inter, 3, norm_layer), PAM(inter),
                                      conv_norm_act(inter, inter, 3, norm_layer))
        self.channel = nn.Sequential(conv_norm_act(in_channels, inter, 3, norm_layer), CAM(),
                                     conv_norm_act(inter, inter, 3, norm_layer))
        self.classifier = nn.Sequential(nn.Dropout2d(0.1), nn.Conv2d(inter, out_channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.position(x) + self.channel(x))


class FPNHead(nn.Module):
    """Feature-pyramid head over all backbone stages: FCFPN, or UperNet with ``pyramid_pooling=True``.

    The top (c4) is reduced to ``fpn_dim`` by a 3x3 conv (preceded by :class:`PyramidPooling` for UperNet); going
    down, each level adds its 1x1 lateral projection to the upsampled coarser level and is refined by a 3x3 conv;
    all levels are upsampled to c1's size, concatenated and classified (3x3 conv to 512, dropout, 1x1).

    Args:
        in_channels: channels of every stage, finest first (c1, c2, c3, c4).
        out_channels: number of classes.
        norm_layer: normalization layer class.
        fpn_dim: channels of the pyramid levels.
        pyramid_pooling: put :class:`PyramidPooling` on the top level (UperNet).

    Shape:
        - Input: ``*features`` (c1..c4) with ``in_channels`` channels.
        - Output: ``B x out_channels x H1 x W1`` (``H1 x W1`` the size of c1).
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int, norm_layer: NormLayer = nn.BatchNorm2d,
                 fpn_dim: int = 256, pyramid_pooling: bool = False) -> None:
        super().__init__()
        if pyramid_pooling:
            pool = PyramidPooling(in_channels[-1], norm_layer)
            self.top = nn.Sequential(pool, *conv_norm_act(pool.out_channels, fpn_dim, 3, norm_layer))
        else:
            self.top = conv_norm_act(in_channels[-1], fpn_dim, 3, norm_layer)
        self.laterals = nn.ModuleList(conv_norm_act(c, fpn_dim, 1, norm_layer) for c in in_channels[:-1])
        self.refine = nn.ModuleList(conv_norm_act(fpn_dim, fpn_dim, 3, norm_layer) for _ in in_channels[:-1])
        self.fuse = nn.Sequential(*conv_norm_act(len(in_channels) * fpn_dim, 512, 3, norm_layer), nn.Dropout(0.1),
                                  nn.Conv2d(512, out_channels, 1))

    def forward(self, *features: Tensor) -> Tensor:
        if len(features) != len(self.laterals) + 1:
            raise ValueError(f"FPNHead expects {len(self.laterals) + 1} feature maps, got {len(features)}")
        size = features[0].shape[-2:]
        feat = self.top(features[-1])
        levels = [resize(feat, size)]
        for i in reversed(range(len(self.laterals))):
            lateral = self.laterals[i](features[i])
            feat = resize(feat, lateral.shape[-2:]) + lateral
            levels.append(resize(self.refine[i](feat), size))
        return self.fuse(torch.cat(levels, dim=1))
