"""encoding.models: dilated backbones, segmentation models, the model registry and multi-scale evaluation.

Build a model with :func:`get_segmentation_model` (``"fcn"``, ``"psp"``, ``"deeplab"``, ``"encnet"``, ``"danet"``,
``"upernet"``, ``"fcfpn"``, ``"deeplabv3plus"``, ``"unet"``, ``"segformer"``), its shortcut ``get_<name>``
(``get_fcn``, ...) or a named preset with :func:`get_model` (see :data:`model_list`; those with published weights:
:func:`pretrained_model_list`). Every model returns
``{"out": B x nclass x H x W}`` (+ ``"aux"``, + ``"se"``) at the input resolution. Each architecture lives in one
file, ``encoding/models/<arch>.py``: its head, its model class and the head factory it registers
(:mod:`~encoding.models.registry`); its ``get_<arch>`` builder is defined here, one line each. The heads shared between
architectures are in :mod:`~encoding.models.heads`, the builders in :mod:`~encoding.models.factory`, pretrained
weights in :mod:`~encoding.models.weights`; every tool describes its network with a :class:`NetworkSpec` and builds it
with :meth:`NetworkSpec.build` (:mod:`~encoding.models.network`).
"""
from .backbone import MobileNetV3Backbone, ResNetBackbone, VGGTinyBackbone, backbone_list, get_backbone
from .base import FeatureInfo, SegmentationModel
from .factory import builder, get_model, get_segmentation_model, pretrained_model_list
from .network import NetworkSpec
from .heads import FCNHead, PyramidPooling
from .registry import ARCHITECTURES, Architecture, model_list, register_architecture
# One module per architecture; importing them registers them (in this order: the order of ARCHITECTURES).
from .fcn import FCN
from .psp import PSP, PSPHead
from .deeplab import ASPP, DeepLabV3, DeepLabV3Head, DeepLabV3Plus, DeepLabV3PlusHead
from .encnet import EncHead, EncModule, EncNet
from .danet import CAM, PAM, DANet, DANetHead
from .fpn import FCFPN, FPNHead, UperNet
from .unet import UNet, UNetHead
from .segformer import SegFormer, SegFormerHead
from .mit import MixTransformer, get_mit
from .hf_segformer import convert_hf_segformer
from .jpu import JPU
from .multieval import MultiEvalModule, SlidingWindow

# The builder of each registered architecture, get_<name> (tests/test_models.py checks there is one per entry of
# ARCHITECTURES).
get_fcn = builder("fcn")
get_psp = builder("psp")
get_deeplab = builder("deeplab")
get_encnet = builder("encnet")
get_danet = builder("danet")
get_upernet = builder("upernet")
get_fcfpn = builder("fcfpn")
get_deeplabv3plus = builder("deeplabv3plus")
get_unet = builder("unet")
get_segformer = builder("segformer")

__all__ = ["ResNetBackbone", "MobileNetV3Backbone", "VGGTinyBackbone", "backbone_list", "get_backbone",
           "SegmentationModel",
           "FeatureInfo",
           "FCN", "PSP", "DeepLabV3", "EncNet", "DANet", "UperNet", "FCFPN", "DeepLabV3Plus", "UNet", "SegFormer",
           "SegFormerHead", "MixTransformer", "get_mit", "convert_hf_segformer",
           "FCNHead", "PSPHead", "PyramidPooling", "ASPP", "DeepLabV3Head", "DeepLabV3PlusHead", "EncModule",
           "EncHead",
           "PAM", "CAM", "DANetHead", "FPNHead", "UNetHead", "JPU",
           "Architecture", "ARCHITECTURES", "register_architecture", "get_segmentation_model", "get_model",
           "NetworkSpec",
           "model_list", "pretrained_model_list",
           "get_fcn", "get_psp", "get_deeplab", "get_encnet", "get_danet", "get_upernet", "get_fcfpn",
           "get_deeplabv3plus", "get_unet", "get_segformer", "MultiEvalModule", "SlidingWindow"]
