"""encoding.models: dilated backbones, segmentation models, the model registry and multi-scale evaluation.

Build a model with :func:`get_segmentation_model` (``"fcn"``, ``"psp"``, ``"deeplab"``, ``"encnet"``, ``"danet"``,
``"upernet"``, ``"fcfpn"``, ``"deeplabv3plus"``, ``"unet"``) or a named preset with :func:`get_model` (see
:data:`model_list`). Every model returns
``{"out": B x nclass x H x W}`` (+ ``"aux"``, + ``"se"``) at the input resolution. Each architecture lives in one
file, ``encoding/models/<arch>.py``: its head, its model class and its ``get_<arch>`` builder.
"""
from .backbone import MobileNetV3Backbone, ResNetBackbone, VGGTinyBackbone, backbone_list, get_backbone
from .base import FeatureInfo, SegmentationModel
from .factory import get_model, get_segmentation_model
from .registry import ARCHITECTURES, Architecture, model_list, register_architecture
# One module per architecture; importing them registers them (in this order: the order of ARCHITECTURES).
from .fcn import FCN, FCNHead, get_fcn
from .psp import PSP, PSPHead, PyramidPooling, get_psp
from .deeplab import ASPP, DeepLabV3, DeepLabV3Head, DeepLabV3Plus, DeepLabV3PlusHead, get_deeplab, get_deeplabv3plus
from .encnet import EncHead, EncModule, EncNet, get_encnet
from .danet import CAM, PAM, DANet, DANetHead, get_danet
from .fpn import FCFPN, FPNHead, UperNet, get_fcfpn, get_upernet
from .unet import UNet, UNetHead, get_unet
from .jpu import JPU
from .multieval import MultiEvalModule

__all__ = ["ResNetBackbone", "MobileNetV3Backbone", "VGGTinyBackbone", "backbone_list", "get_backbone",
           "SegmentationModel",
           "FeatureInfo",
           "FCN", "PSP", "DeepLabV3", "EncNet", "DANet", "UperNet", "FCFPN", "DeepLabV3Plus", "UNet",
           "FCNHead", "PSPHead", "PyramidPooling", "ASPP", "DeepLabV3Head", "DeepLabV3PlusHead", "EncModule",
           "EncHead",
           "PAM", "CAM", "DANetHead", "FPNHead", "UNetHead", "JPU",
           "Architecture", "ARCHITECTURES", "register_architecture", "get_segmentation_model", "get_model",
           "model_list", "get_fcn", "get_psp", "get_deeplab", "get_encnet", "get_danet", "get_upernet", "get_fcfpn",
           "get_deeplabv3plus", "get_unet", "MultiEvalModule"]
