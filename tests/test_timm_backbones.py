"""Tests of the timm backbones: PE's dilated ResNeSt, ``timm:<name>`` for the multi-level heads, SyncBatchNorm
conversion of timm's norm-act layers, exact data parallelism, activation checkpointing, the presets, the FLOP
counter and the scripts (CPU, tiny variants and inputs, random init; nothing is downloaded)."""
import copy

import huggingface_hub.constants
import pytest
import timm
import torch
from torch import nn

from encoding.models import get_backbone, get_model, get_segmentation_model, model_list
from encoding.models.flops import count_flops, fake_mode
from encoding.models.registry import PE_PUBLISHED
from encoding.models.timm_backbones import RESNEST, ResNeStBackbone, TimmBackbone
from encoding.nn import (SegmentationLosses, SyncBatchNorm, SyncBatchNormAct, checkpoint_segmentation_model,
                         convert_sync_batchnorm, is_checkpointed)

from conftest import assert_replicated_step_is_exact

NCLASS = 4
#: One small timm model of each family the multi-level heads are tested with.
FAMILIES = {"resnest": "timm:resnest14d", "convnext": "timm:convnext_atto", "swin": "timm:swin_tiny_patch4_window7_224",
            "efficientnet": "timm:tinynet_e", "regnet": "timm:regnetx_002"}


@pytest.fixture
def tiny_resnest(monkeypatch):
    """``resnest50`` built from timm's ``resnest14d``: the same ResNeSt blocks and code path, one block per stage."""
    monkeypatch.setitem(RESNEST, "resnest50", "resnest14d")


def randomize_running_stats(model):
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)


def no_dropout(model):
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    return model


# ---------------------------------------------------------------------------------------------------- ResNeSt
def test_resnest_at_stride_32_is_timms_features_only_model():
    torch.manual_seed(0)
    ours = get_backbone("resnest50", output_stride=32).eval()
    randomize_running_stats(ours)
    reference = timm.create_model("resnest50d", features_only=True, out_indices=(1, 2, 3, 4)).eval()
    reference.load_state_dict(ours.state_dict())  # the same keys: timm's model without fc
    x = torch.randn(2, 3, 32, 32)
    for a, b in zip(ours(x), reference(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert ours.channels == tuple(reference.feature_info.channels()) == (256, 512, 1024, 2048)


@pytest.mark.parametrize("output_stride, sizes", [(16, [16, 8, 4, 4]), (8, [16, 8, 8, 8])])
def test_resnest_dilation_keeps_the_spatial_size_as_pe_does(output_stride, sizes):
    backbone = get_backbone("resnest50", output_stride=output_stride).eval()
    with torch.no_grad():
        assert [f.shape[-1] for f in backbone(torch.randn(1, 3, 32, 32))] == [s // 2 for s in sizes]
    dilations = {16: [(backbone.layer4, 1, 2)], 8: [(backbone.layer3, 1, 2), (backbone.layer4, 2, 4)]}
    for stage, previous, dilation in dilations[output_stride]:
        first = stage[0]
        assert first.avd_last.stride == 1 and first.avd_last.kernel_size == 3  # PE: a stride-1 3x3 pool
        assert first.downsample[0].kernel_size == first.downsample[0].stride == 1  # PE: a 1x1 avg-down pool
        assert [b.conv2.conv.dilation[0] for b in stage] == [previous] + [dilation] * (len(stage) - 1)
        assert all(m.stride == (1, 1) for m in stage.modules() if isinstance(m, nn.Conv2d))
    assert backbone.layer2[0].avd_last.stride == 2  # the stages before stay strided


def test_every_resnest_name_is_timms_pe_model():
    assert RESNEST == {"resnest50": "resnest50d", "resnest101": "resnest101e", "resnest200": "resnest200e",
                       "resnest269": "resnest269e"}
    with torch.device("meta"):
        backbone = get_backbone("resnest101")
    assert isinstance(backbone, ResNeStBackbone) and len(backbone.layer3) == 23


@pytest.mark.parametrize("name", ["fcn", "psp", "deeplab", "encnet", "danet"])
def test_every_dilated_head_runs_on_resnest(name, tiny_resnest):
    torch.manual_seed(0)
    model = get_segmentation_model(name, backbone="resnest50", nclass=NCLASS, aux=True).eval()
    assert model.backbone.output_stride == 8
    with torch.no_grad():
        out = model(torch.randn(1, 3, 32, 32))
    assert out["out"].shape == out["aux"].shape == (1, NCLASS, 32, 32)


def test_pe_resnest_presets_resolve():
    assert set(PE_PUBLISHED) <= set(model_list)
    assert {"deeplab_resnest101_ade", "encnet_resnest50_pcontext", "encnet_resnest101_pcontext"} <= set(model_list)
    with torch.device("meta"):
        deeplab = get_model("deeplab_resnest101_ade")
        encnet = get_model("encnet_resnest50_pcontext")
    assert isinstance(deeplab.backbone, ResNeStBackbone) and len(deeplab.backbone.layer3) == 23
    assert deeplab.classifier[-1].out_channels == 150 and deeplab.aux_classifier is not None
    assert encnet.classifier.encmodule.selayer.out_features == 59
    assert "upernet_resnest50_ade" not in model_list  # the ResNeSt presets are the dilated models'


# -------------------------------------------------------------------------------------------- timm:<name>
#: Small widths of the multi-level heads (fast tests).
SMALL_HEADS = {"upernet": dict(fpn_dim=16), "fcfpn": dict(fpn_dim=16), "deeplabv3plus": dict(channels=16),
               "unet": dict(decoder_channels=(8, 8, 8))}


@pytest.mark.parametrize("family, head", [("resnest", "upernet"), ("convnext", "fcfpn"), ("swin", "unet"),
                                          ("efficientnet", "deeplabv3plus"), ("regnet", "unet")])
def test_multi_level_heads_on_timm_families(family, head):
    torch.manual_seed(0)
    stride = 32 if family == "swin" else {"deeplabv3plus": 16}.get(head)  # Swin has no dilation
    model = get_segmentation_model(head, backbone=FAMILIES[family], nclass=NCLASS, output_stride=stride,
                                   **SMALL_HEADS[head])
    assert isinstance(model.backbone, TimmBackbone)
    x = torch.randn(2, 3, 32, 32)
    features = model.backbone(x)
    assert [f.shape[1] for f in features] == list(model.backbone.channels)
    assert [f.shape[-1] for f in features] == [8, 4, 2, 32 // model.backbone.output_stride]
    out = model(x)["out"]
    assert out.shape == (2, NCLASS, 32, 32)
    out.mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_swin_takes_any_crop_size():
    model = get_backbone("timm:swin_tiny_patch4_window7_224", output_stride=32).eval()
    with torch.no_grad():
        assert [f.shape[-2:] for f in model(torch.randn(1, 3, 96, 64))] == [(24, 16), (12, 8), (6, 4), (3, 2)]


def test_timm_output_stride_where_supported_and_a_clear_error_where_not():
    backbone = get_backbone("timm:convnext_atto", output_stride=8)
    assert backbone.output_stride == 8 and backbone(torch.randn(1, 3, 64, 64))[-1].shape[-1] == 8
    with pytest.raises(ValueError, match=r"swin_tiny_patch4_window7_224.*no output_stride.*output_stride=32"):
        get_backbone("timm:swin_tiny_patch4_window7_224", output_stride=16)


def test_unknown_timm_name_lists_close_matches():
    with pytest.raises(ValueError, match=r"unknown timm backbone 'convnext_tinny'.*convnext_tiny"):
        get_backbone("timm:convnext_tinny")
    with pytest.raises(ValueError, match=r"unknown backbone 'resnest51'.*resnest50.*timm:<name>"):
        get_backbone("resnest51")


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """No network and empty caches for timm (the Hugging Face Hub) and torch hub."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)


@pytest.mark.parametrize("name, file", [("resnest50", "timm/resnest50d.in1k/resolve/main/model.safetensors"),
                                        ("timm:convnext_atto", "timm/convnext_atto")])
def test_pretrained_offline_fails_in_one_line_naming_the_file(offline_hub, name, file):
    with pytest.raises(ConnectionError) as error:
        get_backbone(name, pretrained=True)
    message = str(error.value)
    assert "\n" not in message and f"https://huggingface.co/{file}" in message
    assert "pretrained_backbone='path/to/" in message
    assert error.value.__cause__ is None and error.value.__suppress_context__


def test_pretrained_from_a_local_timm_file(tmp_path):
    torch.manual_seed(0)
    reference = timm.create_model("convnext_atto")
    path = tmp_path / "convnext_atto.pth"
    torch.save(reference.state_dict(), path)
    backbone = get_backbone("timm:convnext_atto", output_stride=32, pretrained=str(path))
    torch.testing.assert_close(backbone.body.stem_0.weight, reference.stem[0].weight, rtol=0, atol=0)
    torch.save({"nothing": torch.zeros(1)}, tmp_path / "bad.pth")
    with pytest.raises(ValueError, match=r"bad\.pth.*does not fit timm's convnext_atto"):
        get_backbone("timm:convnext_atto", output_stride=32, pretrained=str(tmp_path / "bad.pth"))
    with pytest.raises(ValueError, match=r"missing\.pth.*does not exist"):
        get_backbone("resnest50", pretrained=str(tmp_path / "missing.pth"))


# ------------------------------------------------------------------------------ SyncBatchNorm of timm layers
def test_sync_batchnorm_conversion_keeps_the_act_of_timm_norm_act_layers():
    torch.manual_seed(0)
    plain = timm.create_model("tinynet_e", num_classes=NCLASS, drop_rate=0.0)
    randomize_running_stats(plain)
    acts = {n: type(m.act) for n, m in plain.named_modules() if isinstance(m, timm.layers.BatchNormAct2d)}
    assert acts and set(acts.values()) != {nn.Identity}
    synced = convert_sync_batchnorm(copy.deepcopy(plain))
    converted = {n: type(m.act) for n, m in synced.named_modules() if isinstance(m, SyncBatchNormAct)}
    assert converted == acts and set(synced.state_dict()) == set(plain.state_dict())
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(synced.eval()(x), plain.eval()(x), rtol=0, atol=0)
        # training on one replica: the same outputs and the same running statistics as plain BN
        plain.train(), synced.train()
        torch.testing.assert_close(synced(x), plain(x), rtol=0, atol=0)
    for (name, a), b in zip(synced.named_buffers(), plain.buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_converting_norm_act_layers_to_a_subclass_says_what_it_makes():
    class Custom(SyncBatchNorm):
        pass

    with pytest.raises(ValueError, match="BatchNormAct2d carries drop, act: it converts to SyncBatchNormAct"):
        Custom.convert_sync_batchnorm(timm.layers.BatchNormAct2d(4))


# --------------------------------------------------------------------------------- exact data parallelism
def _assert_parallel_step_is_exact(name, backbone, **kwargs):
    """3 CPU replicas, 7 images split 3/2/2, SyncBatchNorm, float64: loss, gradients and BN statistics equal the
    plain model (nn.BatchNorm2d) on the whole batch."""
    torch.manual_seed(0)
    reference = no_dropout(get_segmentation_model(name, backbone=backbone, nclass=NCLASS, aux=True, **kwargs))
    synced = no_dropout(get_segmentation_model(name, backbone=backbone, nclass=NCLASS, aux=True,
                                               norm_layer=SyncBatchNorm, **kwargs))
    reference.double().train(), synced.double().train()
    synced.load_state_dict(reference.state_dict())
    x = torch.randn(7, 3, 32, 32, dtype=torch.float64)
    target = torch.randint(-1, NCLASS, (7, 32, 32))
    target[5, :20] = -1  # uneven ignore masks across replicas
    criterion = SegmentationLosses(nclass=NCLASS, aux=True)
    assert_replicated_step_is_exact(synced, reference, criterion, x, target, ["cpu"] * 3, [3, 2, 2])


def test_resnest_deeplab_with_sync_batchnorm_is_exact_on_three_replicas(tiny_resnest):
    _assert_parallel_step_is_exact("deeplab", "resnest50", channels=16)


def test_convnext_upernet_is_exact_on_three_replicas():
    _assert_parallel_step_is_exact("upernet", "timm:convnext_atto", fpn_dim=32)


# -------------------------------------------------------------------------------- checkpointing and scripts
@pytest.mark.parametrize("backbone", ["resnest50", "timm:convnext_atto"])
def test_backbone_checkpointing_is_exact(backbone, tiny_resnest):
    torch.manual_seed(0)
    plain = no_dropout(get_segmentation_model("fcn", backbone=backbone, nclass=NCLASS, output_stride=32))
    checkpointed = checkpoint_segmentation_model(copy.deepcopy(plain), "backbone")  # what checkpoint= applies
    assert len([m for m in checkpointed.backbone.modules() if is_checkpointed(m)]) >= 4
    x = torch.randn(2, 3, 32, 32)
    plain(x)["out"].square().mean().backward()
    checkpointed(x)["out"].square().mean().backward()
    for (n, a), b in zip(checkpointed.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0, msg=n)
    for a, b in zip(checkpointed.buffers(), plain.buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("model, backbone", [("deeplab", "resnest50"), ("upernet", "timm:convnext_atto")])
def test_train_script_parses_and_builds_timm_backbones(model, backbone, shapes_root, tmp_path, tiny_resnest):
    from conftest import load_script, tiny_shapes_pair
    from encoding.engine import TrainingConfig, build_training

    args = load_script("train").parse_args(["--model", model, "--backbone", backbone, "--crop-size", "32",
                                             "--base-size", "40", "--batch-size", "2", "--workers", "0",
                                             "--recompute", "backbone", "--output-dir", str(tmp_path / "runs")])
    run = build_training(TrainingConfig(**vars(args)), datasets=tiny_shapes_pair(shapes_root, 2, 2))
    body = run.model.module if hasattr(run.model, "module") else run.model
    assert isinstance(body.backbone, ResNeStBackbone if backbone == "resnest50" else TimmBackbone)


# ----------------------------------------------------------------------------------------------------- FLOPs
def test_flop_count_on_fake_tensors_matches_real_tensors(tiny_resnest):
    torch.manual_seed(0)
    real = get_segmentation_model("fcn", backbone="resnest50", nclass=NCLASS)
    with fake_mode():
        fake = get_segmentation_model("fcn", backbone="resnest50", nclass=NCLASS)
    flops = count_flops(real, (64, 64))
    assert flops == count_flops(fake, (64, 64)) > 0
    assert count_flops(real, (64, 64), batch=2) == 2 * flops
    assert real.training  # the mode is restored
