"""What the dilated backbones share: a stem and four stages (:class:`StagedBackbone`), and the dilation rule that
turns the strides of the last stages into dilations at output stride 8 or 16 (:data:`DILATIONS`, :func:`dilate_stage`).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from torch import Tensor, nn

__all__ = ["StagedBackbone", "DILATIONS", "dilate_stage", "stage_channels"]

#: Output stride -> (previous dilation, dilation) for layer3 and layer4; ``None`` keeps the stage strided.
DILATIONS: Dict[int, Tuple] = {8: ((1, 2), (2, 4)), 16: (None, (1, 2)), 32: (None, None)}


class StagedBackbone(nn.Module):
    """A stem followed by four stages; ``forward`` returns every stage's output (subclasses: ``stem``, ``stages``)."""

    @staticmethod
    def _check_output_stride(output_stride: int) -> None:
        if output_stride not in DILATIONS:
            raise ValueError(f"output_stride must be one of {sorted(DILATIONS)}, got {output_stride}")

    def stem(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def stages(self) -> Tuple[nn.Sequential, ...]:
        raise NotImplementedError

    def forward(self, x: Tensor) -> List[Tensor]:
        x = self.stem(x)
        features = []
        for stage in self.stages():
            x = stage(x)
            features.append(x)
        return features


def stage_channels(stage: nn.Sequential) -> int:
    """Output channels of a stage: those of the last conv of its last block (residual branch or shortcut alike)."""
    return [m for m in stage[-1].modules() if isinstance(m, nn.Conv2d)][-1].out_channels


def dilate_stage(stage: nn.Sequential, previous: int, dilation: int) -> None:
    """Replace the stage's stride 2 by stride 1 and dilate its 3x3 convs in place.

    The first 3x3 conv of the stage (where the stride was) gets ``previous``, every later one ``dilation``.
    """
    first = True
    for module in stage.modules():
        if not isinstance(module, nn.Conv2d):
            continue
        module.stride = (1, 1)
        if module.kernel_size == (3, 3):
            d = previous if first else dilation
            module.dilation, module.padding = (d, d), (d, d)
            first = False
