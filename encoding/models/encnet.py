"""EncNet (Zhang et al., "Context Encoding for Semantic Segmentation", CVPR 2018).

The head encodes the last stage with an :class:`~encoding.nn.Encoding` layer into channel-wise attention and, with
``se_loss``, "which classes are present" logits for the semantic-encoding loss; ``lateral=True`` also fuses ``c2``
and ``c3`` (the multi-level variant).
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.blocks import NormLayer, conv_norm_act, resize
from ..nn.encoding import Encoding
from .base import FeatureInfo, SegmentationModel
from .registry import register_architecture

__all__ = ["EncModule", "EncHead", "EncNet", "encnet_head"]


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
        - Output: a tuple, as PyTorch-Encoding's: ``(B x C x H x W,)``, or ``(B x C x H x W, B x nclass)`` when
          ``se_loss``.
    """

    def __init__(self, in_channels: int, nclass: int, ncodes: int = 32, se_loss: bool = True,
                 norm_layer: NormLayer = nn.BatchNorm2d) -> None:
        super().__init__()
        self.encoding = nn.Sequential(*conv_norm_act(in_channels, in_channels, 1, norm_layer),
                                      Encoding(D=in_channels, K=ncodes))
        self.codeword_norm = norm_layer(ncodes)
        self.fc = nn.Sequential(nn.Linear(in_channels, in_channels), nn.Sigmoid())
        self.selayer = nn.Linear(in_channels, nclass) if se_loss else None

    def forward(self, x: Tensor) -> Union[Tuple[Tensor], Tuple[Tensor, Tensor]]:
        encoded = self.codeword_norm(self.encoding(x).unsqueeze(-1)).squeeze(-1)  # B x K x C
        encoded = F.relu(encoded).mean(dim=1)  # B x C
        gamma = self.fc(encoded)[:, :, None, None]
        out = F.relu(x + x * gamma)
        if self.selayer is None:
            return (out,)
        return out, self.selayer(encoded)


class EncHead(nn.Module):
    """EncNet head: 3x3 conv to ``width``, optional lateral fusion of c2/c3, :class:`EncModule`, then ``conv6``:
    channel dropout (``nn.Dropout2d(0.1)``) and the 1x1 classifier, as PyTorch-Encoding's.

    Unlike PyTorch-Encoding's ``EncHead`` (``lateral=True``), ``lateral`` defaults to ``False``: one network per
    description, the one every builder of this package makes unless asked.

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
        self.conv6 = nn.Sequential(nn.Dropout2d(0.1), nn.Conv2d(width, out_channels, 1))

    def forward(self, *features: Tensor) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        x = self.conv5(features[-1])
        if self.lateral:
            inputs = features[-1 - len(self.connect):-1]
            if len(inputs) != len(self.connect):
                raise ValueError(f"EncHead(lateral=True) needs {len(self.connect) + 1} feature maps, "
                                 f"got {len(features)}")
            laterals = [resize(conv(f), x.shape[-2:]) for conv, f in zip(self.connect, inputs)]
            x = self.fusion(torch.cat([x] + laterals, dim=1))
        out, *se = self.encmodule(x)
        return (self.conv6(out), *se) if se else self.conv6(out)


class EncNet(SegmentationModel):
    """Context encoding network: backbone → :class:`EncHead` on ``(c2, c3, c4)`` (``c2``/``c3`` are used only by the
    lateral variant). The output dict has ``"se"`` when the head was built with ``se_loss``. See
    :class:`SegmentationModel` for the arguments."""

    head_inputs = (1, 2, 3)


@register_architecture("encnet", EncNet, se_loss=True)
def encnet_head(features: FeatureInfo, nclass: int, *, norm_layer: NormLayer = nn.BatchNorm2d,
                se_loss: bool = False, lateral: bool = False, ncodes: int = 32) -> nn.Module:
    """The EncNet head for the backbone ``features``.

    Args:
        se_loss: add the SE-loss branch (``"se"`` logits).
        lateral: fuse ``c2`` and ``c3`` into the encoded feature map.
        ncodes: number of codewords.
    """
    channels = features.channels
    return EncHead(channels[3], nclass, se_loss=se_loss, lateral=lateral, lateral_channels=channels[1:3],
                   ncodes=ncodes, norm_layer=norm_layer)
