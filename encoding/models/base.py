"""The segmentation-model base class: a backbone, an optional neck, a head and an optional auxiliary head."""
from __future__ import annotations

from typing import Dict, Iterator, NamedTuple, Optional, Tuple

from torch import Tensor, nn

from ..nn.blocks import resize

__all__ = ["SegmentationModel", "FeatureInfo"]


class FeatureInfo(NamedTuple):
    """What a head factory needs to know about the features it consumes.

    Attributes:
        channels: channels of the stages ``(c1, c2, c3, c4)`` (after the neck, if any).
        output_stride: stride of ``c4`` relative to the input.
        backbone: the backbone's name (e.g. ``"mit_b0"``: SegFormer's decoder width depends on it).
    """

    channels: Tuple[int, ...]
    output_stride: int
    backbone: str = ""


class SegmentationModel(nn.Module):
    """Backbone → (neck) → head, with an optional auxiliary head on the penultimate stage.

    Subclasses only say which backbone stages the head consumes (``head_inputs``, indices into ``[c1, c2, c3, c4]``).
    The attribute names ``backbone`` / ``classifier`` / ``aux_classifier`` are torchvision's, so torchvision's
    segmentation state dicts load without renaming; PyTorch-Encoding's names ``pretrained`` / ``head`` /
    ``auxlayer`` are read-only properties returning the same modules. As in PE, a model without auxiliary head has
    no ``auxlayer`` (``hasattr(model, "auxlayer")`` is false, reading it raises ``AttributeError``).

    Args:
        backbone: module mapping ``B x 3 x H x W`` to the list of stage features ``[c1, c2, c3, c4]``
            (e.g. :class:`~encoding.models.backbone.ResNetBackbone`).
        classifier: the head; called with the features selected by ``head_inputs``; returns the logits, or
            ``(logits, se_logits)`` for heads with an SE-loss branch.
        aux_classifier: optional head on ``c3`` (e.g. ``FCNHead(c3_channels, nclass)``).
        neck: optional module mapping the feature list to a new one (e.g. :class:`~encoding.models.jpu.JPU`).

    Returns (``forward``):
        ``{"out": B x nclass x H x W}`` plus ``"aux"`` (same shape) with an auxiliary head and ``"se"``
        (``B x nclass`` logits) when the head returns SE logits; all maps at the input resolution
        (bilinear, ``align_corners=False``).
    """

    head_inputs: Tuple[int, ...] = (3,)
    aux_input: int = 2

    def __init__(self, backbone: nn.Module, classifier: nn.Module, aux_classifier: Optional[nn.Module] = None,
                 neck: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.backbone = backbone
        self.neck = neck
        self.classifier = classifier
        self.aux_classifier = aux_classifier

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        size = x.shape[-2:]
        features = self.backbone(x)
        if self.neck is not None:
            features = self.neck(*features)
        logits = self.classifier(*(features[i] for i in self.head_inputs))
        se = None
        if isinstance(logits, tuple):
            logits, se = logits
        outputs = {"out": resize(logits, size)}
        if self.aux_classifier is not None:
            outputs["aux"] = resize(self.aux_classifier(features[self.aux_input]), size)
        if se is not None:
            outputs["se"] = se
        return outputs

    # PyTorch-Encoding's attribute names (read-only views of the same modules; not in the state dict).
    @property
    def pretrained(self) -> nn.Module:
        """The backbone, under PyTorch-Encoding's name (``BaseNet.pretrained``)."""
        return self.backbone

    @property
    def head(self) -> nn.Module:
        """The head, under PyTorch-Encoding's name (``BaseNet.head``); the same module as ``classifier``."""
        return self.classifier

    @property
    def auxlayer(self) -> nn.Module:
        """The auxiliary head, under PyTorch-Encoding's name (``BaseNet.auxlayer``); ``aux_classifier``.

        Raises:
            AttributeError: the model has no auxiliary head (built with ``aux=False``): as PE's ``BaseNet``, which set
                ``auxlayer`` only with ``aux=True``, so PE's ``if hasattr(model, 'auxlayer')`` keeps working.
        """
        if self.aux_classifier is None:
            raise AttributeError("auxlayer: built without an auxiliary head (aux=False)")
        return self.aux_classifier

    def head_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters outside the backbone (neck and heads), e.g. for a 10x learning rate."""
        for name, module in self.named_children():
            if name != "backbone":
                yield from module.parameters()
