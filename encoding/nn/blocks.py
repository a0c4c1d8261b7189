"""Small generic building blocks shared by the model heads, all with a configurable ``norm_layer``.

``norm_layer`` is any callable ``norm_layer(num_features) -> nn.Module`` accepting ``B x C x H x W`` input, such as
``nn.BatchNorm2d`` (the default) or ``encoding.nn.SyncBatchNorm``. The heads themselves live with their models in
``encoding.models.<arch>``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["NormLayer", "resize", "conv_norm_act", "SeparableConv2d"]

#: ``norm_layer(num_features) -> nn.Module``, e.g. ``nn.BatchNorm2d`` or ``encoding.nn.SyncBatchNorm``.
NormLayer = Callable[[int], nn.Module]


def resize(x: Tensor, size: Sequence[int], mode: str = "bilinear", align_corners: Optional[bool] = False) -> Tensor:
    """Resize of ``B x C x H x W`` to ``size`` (default bilinear, ``align_corners=False``); a no-op at the same size
    (not skipped while ``torch.export`` traces: the test would fix a dynamic export to the traced sizes)."""
    if not torch.compiler.is_exporting() and tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=tuple(size), mode=mode, align_corners=align_corners)


_UP_MODES = ("nearest", "nearest-exact", "bilinear", "bicubic", "area")


def up_kwargs_of(up_kwargs: Optional[Mapping[str, Any]], owner: str) -> Dict[str, Any]:
    """PyTorch-Encoding's ``up_kwargs`` (e.g. ``{"mode": "bilinear", "align_corners": True}``) as :func:`resize`'s
    keywords; ``None``: bilinear with ``align_corners=False``.

    Raises:
        ValueError: not such a dict (the message names ``up_kwargs`` and ``owner``).
    """
    if up_kwargs is None:
        return {"mode": "bilinear", "align_corners": False}
    mode = up_kwargs.get("mode", "bilinear") if isinstance(up_kwargs, Mapping) else None
    align = up_kwargs.get("align_corners") if isinstance(up_kwargs, Mapping) else None
    interpolating = mode in ("bilinear", "bicubic")
    if (mode not in _UP_MODES or set(up_kwargs) - {"mode", "align_corners"}
            or not (interpolating or align is None or align is False)):
        raise ValueError(f"{owner}: up_kwargs must be a dict of 'mode' (one of {', '.join(_UP_MODES)}) and "
                         f"'align_corners' (bilinear / bicubic only), PyTorch-Encoding's; got {up_kwargs!r}")
    return {"mode": mode, "align_corners": bool(align) if interpolating else None}


def positional_up_kwargs(value: Any, default: Any, up_kwargs: Optional[Mapping[str, Any]], owner: str,
                         name: str) -> Tuple[Any, Dict[str, Any]]:
    """``(value, resize keywords)`` of a module whose parameter ``name`` sits where PyTorch-Encoding's signature had
    ``up_kwargs``: a dict given there is PE's ``up_kwargs`` (``value`` is then ``default``), else ``up_kwargs``.

    Raises:
        TypeError: a dict in ``name``'s place and ``up_kwargs`` too. ValueError: see :func:`up_kwargs_of`.
    """
    if isinstance(value, Mapping):
        if up_kwargs is not None:
            raise TypeError(f"{owner}: {name} is a dict ({value!r}), PyTorch-Encoding's up_kwargs, and up_kwargs is "
                            "given too")
        value, up_kwargs = default, value
    return value, up_kwargs_of(up_kwargs, owner)


def conv_norm_act(in_channels: int, out_channels: int, kernel_size: int = 3, norm_layer: NormLayer = nn.BatchNorm2d,
                  dilation: int = 1, stride: int = 1) -> nn.Sequential:
    """``Conv2d`` (no bias, "same" padding) → ``norm_layer`` → ``ReLU``, as ``nn.Sequential`` (keys ``0``,
    ``1``)."""
    padding = dilation * (kernel_size // 2)
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=padding, dilation=dilation, bias=False),
        norm_layer(out_channels),
        nn.ReLU(inplace=True),
    )


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
