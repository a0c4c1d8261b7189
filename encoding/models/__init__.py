"""encoding.models: dilated backbones, segmentation models, the model registry and multi-scale evaluation.

Build a model with :func:`get_segmentation_model` (``"fcn"``, ``"psp"``, ``"deeplab"``, ``"encnet"``, ``"danet"``,
``"upernet"``, ``"fcfpn"``) or a named preset with :func:`get_model` (see :data:`model_list`). Every model returns
``{"out": B x nclass x H x W}`` (+ ``"aux"``, + ``"se"``) at the input resolution.
"""
from .backbone import ResNetBackbone, backbone_list, get_backbone
from .base import SegmentationModel
from .danet import DANet
from .deeplab import DeepLabV3
from .encnet import EncNet
from .fcn import FCN
from .fpn import FCFPN, UperNet
from .model_zoo import (ARCHITECTURES, Architecture, get_danet, get_deeplab, get_encnet, get_fcfpn, get_fcn,
                        get_model, get_psp, get_segmentation_model, get_upernet, model_list)
from .multieval import MultiEvalModule
from .psp import PSP

__all__ = ["ResNetBackbone", "backbone_list", "get_backbone", "SegmentationModel",
           "FCN", "PSP", "DeepLabV3", "EncNet", "DANet", "UperNet", "FCFPN",
           "Architecture", "ARCHITECTURES", "get_segmentation_model", "get_model", "model_list",
           "get_fcn", "get_psp", "get_deeplab", "get_encnet", "get_danet", "get_upernet", "get_fcfpn",
           "MultiEvalModule"]
