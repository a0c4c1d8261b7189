"""PyTorch-Encoding's ``BaseNet``: the base class PE users' own segmentation networks subclass.

PE's networks were written as::

    class MyNet(BaseNet):
        def __init__(self, nclass, backbone, aux=True, se_loss=False, norm_layer=nn.BatchNorm2d, **kwargs):
            super().__init__(nclass, backbone, aux, se_loss, norm_layer=norm_layer, **kwargs)
            self.head = MyHead(2048, nclass, norm_layer)

        def forward(self, x):
            _, _, c3, c4 = self.base_forward(x)
            return (F.interpolate(self.head(c4), x.shape[2:], **self._up_kwargs),)

:class:`BaseNet` keeps that contract on the toolkit's backbones (:func:`encoding.models.backbone.get_backbone`):
``self.pretrained`` is the backbone (a ResNet's ``conv1`` / ``bn1`` / ``relu`` / ``maxpool`` / ``layer1-4``, PE's
state-dict keys ``pretrained.layer1...``), ``base_forward`` returns ``c1, c2, c3, c4``, ``evaluate`` returns the
predictions or PE's four counts, and ``nclass`` / ``aux`` / ``se_loss`` / ``mean`` / ``std`` / ``base_size`` /
``crop_size`` / ``backbone`` / ``_up_kwargs`` are PE's attributes. Declared in ``encoding.models`` and
``encoding.models.base`` (PE's ``encoding.models.base.BaseNet``); building a ``BaseNet`` itself (not a subclass)
warns, naming :class:`~encoding.models.base.SegmentationModel`.

Differences from PE: the backbone starts from random weights unless ``pretrained_backbone`` says otherwise (PE
downloaded ImageNet weights into ``root`` on every construction; ``root`` is accepted at PE's default only, the
weights are cached where torchvision / timm cache them); an option PE passed on to its backbone factory
(``*args`` / ``**kwargs``) is refused, naming it, rather than ignored.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

from torch import Tensor, nn

from ..models.backbone import get_backbone
from ..models.weights import Pretrained
from ..utils.metrics import confusion_matrix, to_labels
from .declare import old_name

__all__ = ["BaseNet"]

#: PE's ``up_kwargs``: how heads' logits are resized to the input.
UP_KWARGS = {"mode": "bilinear", "align_corners": True}
_PE_ROOT = "~/.encoding/models"


@old_name("encoding.models", "encoding.models.base", new="encoding.models.SegmentationModel")
class BaseNet(nn.Module):
    """PyTorch-Encoding's segmentation base class (see the module's docstring).

    Args:
        nclass: the number of classes.
        backbone: a backbone name of :func:`~encoding.models.backbone.get_backbone` (``resnet50``, ...).
        aux: whether the subclass adds an auxiliary head (stored as ``self.aux``).
        se_loss: whether the subclass adds an SE-loss head (stored as ``self.se_loss``).
        dilated: output stride 8 (PE's dilated ResNet: ``layer3`` dilation 2, ``layer4`` 4); ``False``: 32.
        norm_layer: the backbone's normalization layer (``None``: ``nn.BatchNorm2d``).
        base_size, crop_size, mean, std: PE's attributes of the same names (the evaluation's sizes, the inputs'
            normalisation).
        root: PE's weights folder; only its default is accepted (the weights are cached by torchvision / timm).
        pretrained_backbone: ``False`` (random), ``True`` (ImageNet weights) or a local state-dict file.

    Raises:
        TypeError: an extra positional or keyword option (PE passed them to its backbone factory), naming it.
        ValueError: an unknown backbone (the message lists the valid ones), another ``root``.
    """

    def __init__(self, nclass: int, backbone: str, aux: bool, se_loss: bool, dilated: bool = True,
                 norm_layer: Optional[type] = None, base_size: int = 520, crop_size: int = 480,
                 mean: Sequence[float] = (.485, .456, .406), std: Sequence[float] = (.229, .224, .225),
                 root: str = _PE_ROOT, *args: Any, pretrained_backbone: Pretrained = False, **kwargs: Any) -> None:
        super().__init__()
        if args or kwargs:
            extra = [repr(a)[:40] for a in args] + list(kwargs)
            raise TypeError(f"BaseNet: option(s) {', '.join(extra)} are not taken (PyTorch-Encoding passed them on "
                            "to its backbone factory); build the backbone yourself and assign self.pretrained")
        if root != _PE_ROOT:
            raise ValueError(f"BaseNet(root={root!r}): weights are cached where torchvision / timm cache them "
                             "($TORCH_HOME); pass pretrained_backbone=PATH for a local file")
        self.nclass, self.aux, self.se_loss = int(nclass), bool(aux), bool(se_loss)
        self.mean, self.std = list(mean), list(std)
        self.base_size, self.crop_size = base_size, crop_size
        self.backbone = backbone
        self.pretrained = get_backbone(backbone, 8 if dilated else 32, norm_layer or nn.BatchNorm2d,
                                       pretrained_backbone)
        self._up_kwargs = dict(UP_KWARGS)

    def base_forward(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """The backbone's four stage outputs ``c1, c2, c3, c4`` (strides 4, 8, 8, 8 dilated; 4, 8, 16, 32 not)."""
        c1, c2, c3, c4 = self.pretrained(x)
        return c1, c2, c3, c4

    def evaluate(self, x: Tensor, target: Optional[Tensor] = None) -> Union[Tensor, Tuple[int, int, Any, Any]]:
        """PE's evaluation: the main output of ``forward(x)`` (the first of a tuple or list), or with ``target``
        (``-1`` unlabeled) PE's ``(correct, labeled, inter, union)`` of ``batch_pix_accuracy`` and
        ``batch_intersection_union`` (two ints, two per-class int64 numpy arrays)."""
        pred = self.forward(x)
        if isinstance(pred, (tuple, list)):
            pred = pred[0]
        if target is None:
            return pred
        labels, _ = to_labels(pred, target, self.nclass)
        confusion = confusion_matrix(labels, target, self.nclass, ignore_index=-1)
        inter = confusion.diagonal()
        union = confusion.sum(0) + confusion.sum(1) - inter
        return int(inter.sum()), int(confusion.sum()), inter.cpu().numpy(), union.cpu().numpy()
