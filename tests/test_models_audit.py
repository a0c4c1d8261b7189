"""Tests of the models audit's findings: PE's ``dilated=`` keyword, torchvision's MobileNetV3 BatchNorm settings,
MiT's minimum input size, ``nclass`` validation and PE's ``EncHead`` / ``EncModule`` contracts (CPU, tiny networks,
nothing downloaded)."""
import pathlib
import re
import warnings

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

import encoding
from encoding.errors import EncodingError
from encoding.models import (EncHead, EncModule, MultiEvalModule, NetworkSpec, SlidingWindow, get_backbone,
                             get_segmentation_model)

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def build(name, backbone="resnet18", **kwargs):
    kwargs.setdefault("nclass", 3)
    return get_segmentation_model(name, backbone=backbone, **kwargs)


def c4_stride(model, size=64):
    return size // model.backbone(torch.randn(1, 3, size, size))[-1].shape[-1]


# ------------------------------------------------------------------------------------------- 1. PE's dilated=
@pytest.mark.parametrize("name, dilated, stride", [
    ("deeplabv3plus", True, 8), ("upernet", True, 8), ("unet", True, 8), ("fcn", False, 32),
    ("deeplabv3plus", False, 32), ("fcn", True, 8)])
def test_pe_dilated_keyword_sets_the_output_stride(name, dilated, stride):
    """PE: ``dilated=True`` is the dilated backbone (output stride 8), ``dilated=False`` the plain one (32), on every
    model (until this release ``dilated=True`` was dropped: DeepLabV3+ stayed at 16, UperNet at 32)."""
    model = build(name, dilated=dilated).eval()
    assert model.backbone.output_stride == stride
    with torch.no_grad():
        assert c4_stride(model) == stride


@pytest.mark.parametrize("options, message", [
    (dict(dilated=False, output_stride=8), "dilated=False conflicts with output_stride=8"),
    (dict(dilated=True, output_stride=32), "dilated=True conflicts with output_stride=32"),
    (dict(dilated=True, output_stride=16), "dilated=True conflicts with output_stride=16"),
    (dict(dilated=True, jpu=True), "dilated=True conflicts with jpu=True"),
    (dict(dilated=True, jpu="JPU"), "dilated=True conflicts with jpu=True"),
])
def test_pe_dilated_contradicting_the_output_stride_is_refused(options, message):
    with pytest.raises(ValueError, match=message) as caught:
        build("fcn", **options)
    assert isinstance(caught.value, EncodingError)


def test_pe_dilated_agreeing_with_the_stride_builds():
    assert build("fcn", dilated=True, output_stride=8).backbone.output_stride == 8
    assert build("fcn", dilated=False, output_stride=32).backbone.output_stride == 32
    plain = build("fcn", dilated=False, jpu=True)  # FastFCN: a plain backbone under JPU
    assert plain.backbone.output_stride == 32 and isinstance(plain.neck, encoding.models.JPU)
    assert encoding.models.get_deeplabv3plus("pascal_voc", "resnet18", dilated=True).backbone.output_stride == 8


@pytest.mark.parametrize("name, backbone, dilated, refusal", [
    ("segformer", "mit_b0", True, r"mit_b0 has output stride 32 only.*got output_stride=8"),
    ("unet", "vgg_tiny", False, r"output_stride of vgg_tiny must be 8 or 16, got 32"),
])
def test_a_stride_the_backbone_cannot_take_is_refused_naming_dilated(name, backbone, dilated, refusal):
    with pytest.raises(ValueError, match=rf"{refusal}.*dilated={dilated} is output_stride="):
        build(name, backbone, dilated=dilated)


# ------------------------------------------------------------------------- 2. MobileNetV3's BatchNorm settings
def test_mobilenet_backbone_computes_torchvisions_features_of_the_same_weights():
    """Same state dict, eval mode, a BatchNorm with small running variances: our backbone's ``c4`` is torchvision's
    default-built model's ``features`` output exactly (its BatchNorm eps is 0.001, not 1e-5)."""
    torch.manual_seed(0)
    reference = torchvision.models.mobilenet_v3_small().eval()
    bn = [m for m in reference.features.modules() if isinstance(m, nn.BatchNorm2d)][0]
    with torch.no_grad():
        bn.running_mean.normal_(0, 0.1)
        bn.running_var.uniform_(0.002, 0.01)
    ours = get_backbone("mobilenet_v3_small", output_stride=32).eval()
    ours.load_state_dict({k: v for k, v in reference.state_dict().items() if k.startswith("features.")})
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[-1], reference.features(x), rtol=0, atol=0)


@pytest.mark.parametrize("norm_layer", [nn.BatchNorm2d, encoding.nn.SyncBatchNorm])
def test_mobilenet_norm_layers_have_torchvisions_eps(norm_layer):
    model = build("fcn", "mobilenet_v3_small", norm_layer=norm_layer, output_stride=32)
    backbone = [m for m in model.backbone.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    head = [m for m in model.classifier.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    # the eps its weights compute with; the momentum stays the norm layer's (0.01 starves short runs from scratch)
    assert backbone and all(type(m) is norm_layer and (m.eps, m.momentum) == (0.001, 0.1) for m in backbone)
    assert head and all((m.eps, m.momentum) == (1e-5, 0.1) for m in head)  # the heads keep the defaults


# ----------------------------------------------------------------------------------- 3. MiT's minimum input
def _raw_forward_fits(size):
    """Whether MiT-B0's stages run on ``size x size`` without the size check (the convs' own verdict)."""
    x = torch.zeros(1, 3, size, size, device="meta")
    backbone = get_backbone("mit_b0", output_stride=32).to("meta")
    try:
        for layer in backbone.layers:
            x = layer(x)
    except RuntimeError:
        return False
    return True


def test_mit_minimum_input_size_is_what_its_convs_need():
    from encoding.models.mit import min_input_size

    assert min_input_size() == 29
    assert _raw_forward_fits(min_input_size()) and not _raw_forward_fits(min_input_size() - 1)


@pytest.mark.parametrize("size", [(28, 64), (64, 28), (16, 16)])
def test_mit_refuses_a_small_input_naming_the_network_and_sizes(size):
    model = build("segformer", "mit_b0").eval()
    calls = []
    model.backbone.layers[0].patch_embed.register_forward_pre_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match=rf"mit_b0 needs inputs of at least 29 x 29 pixels, got {size[0]} x "
                                         rf"{size[1]} \(SegFormer") as caught, torch.no_grad():
        model(torch.randn(1, 3, *size))
    assert isinstance(caught.value, EncodingError) and not calls  # raised before any conv
    with torch.no_grad():
        assert model(torch.randn(1, 3, 29, 29))["out"].shape == (1, 3, 29, 29)


@pytest.mark.filterwarnings("ignore:window batch:RuntimeWarning")  # the window budget cannot simulate it either
def test_segment_and_sliding_windows_too_small_for_mit_say_so():
    model = build("segformer", "mit_b0").eval()
    image = np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    message = r"mit_b0 needs inputs of at least 29 x 29 pixels, got {} x {}"
    with pytest.raises(ValueError, match=message.format(16, 16)):
        encoding.segment(model, image, mode="slide", window=16)
    with pytest.raises(ValueError, match=message.format(16, 16)):
        encoding.segment(model, image, mode="slide", window=16, window_memory="1GiB")
    with pytest.raises(ValueError, match=message.format(20, 64)):
        encoding.segment(model, image[:20])
    with pytest.raises(ValueError, match=message.format(20, 20)):
        SlidingWindow(model, 20)(torch.randn(1, 3, 64, 64))
    with pytest.raises(ValueError, match=message.format(24, 24)):
        MultiEvalModule(model, 3, base_size=64, crop_size=24, scales=(1.0,), flip=False)(torch.randn(1, 3, 64, 64))
    assert encoding.segment(model, image, mode="slide", window=32).shape == (64, 64)


# ----------------------------------------------------------------------------------------- 4. nclass checked
BAD_NCLASS = [0, -2, 2.5, True, False, "3", np.int64(3)]


@pytest.mark.parametrize("nclass", BAD_NCLASS, ids=repr)
def test_nclass_must_be_a_positive_int(nclass):
    message = f"nclass: the class count must be a positive int, got {re.escape(repr(nclass))}"
    with pytest.raises(ValueError, match=message):
        build("fcn", nclass=nclass)
    with pytest.raises(ValueError, match="nclass: the class count must be a positive int"):
        get_segmentation_model("torchvision:lraspp_mobilenet_v3_large", nclass=nclass)
    with pytest.raises(ValueError, match="the class count must be a positive int"):  # the same rule
        NetworkSpec("fcn", nclass, backbone="resnet18")


def test_nclass_one_and_dataset_classes_still_build():
    assert build("fcn", nclass=1).classifier[-1].out_channels == 1
    assert get_segmentation_model("fcn", dataset="pcontext", backbone="resnet18").classifier[-1].out_channels == 59


# ------------------------------------------------------------------------------- 5. PE's EncHead / EncModule
def test_encmodule_returns_a_tuple_as_pe():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 4, 4)
    plain = EncModule(16, 5, ncodes=4, se_loss=False).eval()
    with torch.no_grad():
        out = plain(x)
        assert isinstance(out, tuple) and len(out) == 1 and out[0].shape == x.shape
        assert list(plain(x))[0].shape == x.shape  # PE's `list(self.encmodule(x))[0]`: the features, not image 0
        features, se = EncModule(16, 5, ncodes=4, se_loss=True).eval()(x)
    assert features.shape == x.shape and se.shape == (2, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # PE's import path warns
        assert isinstance(encoding.nn.EncModule(16, 5, ncodes=4, se_loss=False).eval()(x), tuple)


def test_enchead_conv6_is_pe_channel_dropout_with_the_same_state_dict():
    head = EncHead(32, 5, se_loss=False, width=16, ncodes=4)
    assert type(head.conv6[0]) is nn.Dropout2d and head.conv6[0].p == 0.1 and not head.conv6[0].inplace
    assert [k for k in head.state_dict() if k.startswith("conv6.")] == ["conv6.1.weight", "conv6.1.bias"]
    torch.manual_seed(0)
    dropped = head.conv6[0].train()(torch.ones(4, 16, 3, 3))
    per_channel = dropped.flatten(2)
    assert torch.equal(per_channel.amax(-1), per_channel.amin(-1))  # whole channels dropped
    assert (per_channel.amax(-1) == 0).any()
    assert not head.lateral  # one network per description (PE: lateral=True), documented below


@pytest.mark.parametrize("se_loss", [False, True])
def test_encnet_outputs_unchanged_by_the_tuple(se_loss):
    model = build("encnet", se_loss=se_loss).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 32, 32))
    assert set(out) == ({"out", "se"} if se_loss else {"out"}) and out["out"].shape == (1, 3, 32, 32)


def test_docs_state_the_enchead_differences_from_pe():
    text = (DOCS / "models.md").read_text(encoding="utf-8")
    differences = text[text.index("## Differences from PyTorch-Encoding"):]
    differences = differences[:differences.index("\n## ")]
    assert "`EncHead` defaults to `lateral=False`" in differences and "`Dropout2d(0.1)`" in differences
