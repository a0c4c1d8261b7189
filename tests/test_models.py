"""Tests of encoding.models: backbones, the model registry, torchvision compatibility, data parallelism and
multi-scale evaluation (CPU, small backbones and inputs; nothing is downloaded)."""
import os
import urllib.error

import pytest
import torch
import torchvision
from torch import nn
from torchvision.models.segmentation import (DeepLabV3_ResNet50_Weights, FCN_ResNet50_Weights, deeplabv3_resnet50,
                                             fcn_resnet50)

import encoding
from encoding.models import (ARCHITECTURES, EncNet, MultiEvalModule, backbone_list, get_backbone, get_model,
                             get_segmentation_model, model_list)
from encoding.nn import SegmentationLosses
from encoding.parallel import DataParallelCriterion, DataParallelModel

from conftest import assert_replicated_step_is_exact

NCLASS = 5
CONFIGS = [(name, aux, se) for name, arch in ARCHITECTURES.items()
           for aux, se in ((False, False), (True, arch.se_loss))]


def build(name, aux=False, se_loss=False, **kwargs):
    kwargs.setdefault("nclass", NCLASS)
    return get_segmentation_model(name, backbone="resnet18", aux=aux, se_loss=se_loss, **kwargs)


def expected_keys(aux, se):
    return {"out"} | ({"aux"} if aux else set()) | ({"se"} if se else set())


def randomize_running_stats(model):
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._NormBase):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty torch hub cache (TORCH_HOME) and no network: returns the checkpoint cache directory."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torch.hub, "_hub_dir", None)

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("network disabled in tests")

    monkeypatch.setattr(torch.hub, "urlopen", no_network)
    return tmp_path / "hub" / "checkpoints"


# ---------------------------------------------------------------------------------------- the registry tester
@pytest.mark.parametrize("name, aux, se", CONFIGS)
def test_model_contract_and_backward(name, aux, se):
    torch.manual_seed(0)
    model = build(name, aux, se).train()
    outputs = model(torch.randn(2, 3, 32, 32))
    assert isinstance(outputs, dict) and set(outputs) == expected_keys(aux, se)
    assert list(outputs)[0] == "out"
    for key in ("out", "aux"):
        if key in outputs:
            assert outputs[key].shape == (2, NCLASS, 32, 32)
    if se:
        assert outputs["se"].shape == (2, NCLASS)
    sum(v.square().mean() for v in outputs.values()).backward()
    # every parameter takes part (DDP without find_unused_parameters) and gets a finite gradient
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_model_under_data_parallel_matches_plain_run(name):
    """Two CPU replicas, uneven split (2 + 1): per-replica outputs, loss and gradients equal the plain run."""
    torch.manual_seed(0)
    se = ARCHITECTURES[name].se_loss
    model = build(name, aux=True, se_loss=se).eval()  # eval: BN running stats, no dropout
    randomize_running_stats(model)
    x = torch.randn(3, 3, 32, 32)
    target = torch.randint(-1, NCLASS, (3, 32, 32))
    target[2, :20] = -1  # uneven ignore mask across replicas
    criterion = SegmentationLosses(se_loss=se, nclass=NCLASS, aux=True)

    outputs = DataParallelModel(model, device_ids=["cpu", "cpu"])(x)
    assert len(outputs) == 2 and all(set(o) == expected_keys(True, se) for o in outputs)
    loss = DataParallelCriterion(criterion, device_ids=["cpu", "cpu"])(outputs, target)
    loss.backward()
    parallel_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    plain = model(x)
    for key, value in plain.items():
        torch.testing.assert_close(torch.cat([o[key] for o in outputs]), value, rtol=1e-5, atol=1e-5)
    plain_loss = criterion(plain, target)
    plain_loss.backward()
    assert loss.dim() == 0
    torch.testing.assert_close(loss, plain_loss, rtol=1e-6, atol=1e-6)
    for (n, p), a in zip(model.named_parameters(), parallel_grads):
        torch.testing.assert_close(a, p.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_sync_batchnorm_model_under_data_parallel_trains_like_full_batch():
    """Train mode with encoding.nn.SyncBatchNorm on 2 CPU replicas = nn.BatchNorm2d on the whole batch."""
    torch.manual_seed(0)
    reference = build("psp", aux=True).double().train()
    synced = build("psp", aux=True, norm_layer=encoding.nn.SyncBatchNorm).double().train()
    synced.load_state_dict(reference.state_dict())
    for model in (reference, synced):
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    target = torch.randint(0, NCLASS, (3, 32, 32))
    criterion = SegmentationLosses(nclass=NCLASS, aux=True)
    assert_replicated_step_is_exact(synced, reference, criterion, x, target, ["cpu", "cpu"], [2, 1])


# ------------------------------------------------------------------------------------------------ registry API
def test_registry_errors():
    valid = "fcn, psp, deeplab, deeplabv3plus, encnet, danet, upernet, fcfpn, unet, segformer"
    with pytest.raises(ValueError, match=f"unknown segmentation model 'segnet'; valid: {valid}"):
        get_segmentation_model("segnet", nclass=NCLASS)
    with pytest.raises(ValueError, match="valid backbones: resnet18.*mobilenet_v3_large, mobilenet_v3_small, vgg_tiny"):
        get_segmentation_model("fcn", backbone="vgg16", nclass=NCLASS)
    with pytest.raises(ValueError, match="se_loss=True is not supported by 'fcn'.*encnet"):
        build("fcn", se_loss=True)
    with pytest.raises(ValueError, match="output_stride=32"):
        build("fcn", jpu=True, output_stride=8)
    with pytest.raises(ValueError, match="model 'fcn' has no head option lateral; its head options: none"):
        build("fcn", lateral=True)  # head options are checked against the head factory's signature
    with pytest.raises(ValueError, match="no head option ncodes; its head options: atrous_rates, channels"):
        build("deeplabv3plus", ncodes=8)
    with pytest.raises(ValueError, match="no head option channels; its head options: decoder_channels"):
        build("unet", channels=8)
    with pytest.raises(ValueError, match="decoder_channels needs 3 values"):
        build("unet", decoder_channels=(8, 8))
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*pascal_voc"):
        get_segmentation_model("fcn", dataset="nope", backbone="resnet18")


def test_registering_an_architecture_defines_its_builder():
    """Every registered architecture has its ``encoding.models.get_<name>``, which builds that architecture; the
    registry itself is a leaf (it imports no module of ``encoding``)."""
    import ast

    import encoding.models.registry as registry

    for name, arch in ARCHITECTURES.items():
        build_it = getattr(encoding.models, f"get_{name}")
        assert build_it.__name__ == f"get_{name}" and build_it.__doc__.startswith(arch.title)
        assert type(build_it(backbone="resnet18", nclass=NCLASS)) is arch.model
    # each builder is a statement static tools see (no globals().update), and public
    package = ast.parse(open(encoding.models.__file__, encoding="utf-8").read())
    assigned = {t.id for n in package.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert {f"get_{name}" for name in ARCHITECTURES} <= assigned & set(encoding.models.__all__)
    tree = ast.parse(open(registry.__file__, encoding="utf-8").read())
    typing_only = {id(n) for block in tree.body
                   if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING" for n in ast.walk(block)}
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in typing_only]
    names = [a.name for n in imports if isinstance(n, ast.Import) for a in n.names]
    names += ["." * n.level + (n.module or "") for n in imports if isinstance(n, ast.ImportFrom)]
    leaves = ("..registry", "encoding.registry")  # the registry helper, itself a leaf
    assert names and not [m for m in names if m.startswith((".", "encoding")) and m not in leaves], names


def test_number_of_classes_comes_from_the_dataset_registry():
    from encoding.datasets import datasets
    model = get_segmentation_model("fcn", dataset="shapes", backbone="resnet18")
    assert model.classifier[-1].out_channels == datasets["shapes"].NUM_CLASS == 7


def test_presets():
    assert {"encnet_resnet50_pcontext", "fcn_resnet50_ade", "deeplab_resnet101_coco"} <= set(model_list)
    with torch.device("meta"):  # structure only: no memory, no initialization cost
        model = get_model("encnet_resnet50_pcontext")
    assert isinstance(model, EncNet) and model.aux_classifier is not None
    assert model.classifier.encmodule.selayer.out_features == 59  # pcontext, from the dataset registry
    assert model.backbone.channels == (256, 512, 1024, 2048)
    with pytest.raises(ValueError, match="<model>_<backbone>_<dataset>.*encnet.*pcontext"):
        get_model("encnet_resnet50_nowhere")


@pytest.mark.parametrize("short, dataset", [("ade", "ade20k"), ("pcontext", "pcontext"), ("voc", "pascal_voc"),
                                            ("aug", "pascal_aug"), ("citys", "citys"), ("coco", "coco")])
def test_preset_dataset_names(short, dataset):
    from encoding.datasets import datasets
    assert f"fcn_resnet101_{short}" in model_list
    with torch.device("meta"):
        model = get_model(f"fcn_resnet101_{short}")
    assert model.classifier[-1].out_channels == model.aux_classifier[-1].out_channels == datasets[dataset].NUM_CLASS
    assert len(model.backbone.layer3) == 23  # resnet101


@pytest.mark.parametrize("options, shape, rates", [
    (dict(output_stride=16), (2, 512, 4, 4), [6, 12, 18]),
    (dict(output_stride=32), (2, 512, 2, 2), [3, 6, 9]),
    (dict(jpu=True), (2, 2048, 8, 8), [12, 24, 36]),  # JPU features are at stride 8
])
def test_output_stride_and_jpu(options, shape, rates):
    model = build("deeplab", aux=True, **options)
    x = torch.randn(2, 3, 64, 64)
    features = model.backbone(x)
    if model.neck is not None:
        features = model.neck(*features)
    assert features[3].shape == shape
    assert [branch[0].dilation[0] for branch in model.classifier[0].convs[1:4]] == rates
    outputs = model(x)
    assert outputs["out"].shape == outputs["aux"].shape == (2, NCLASS, 64, 64)


def test_norm_layer_reaches_every_module():
    class MarkedNorm(nn.BatchNorm2d):
        pass

    model = build("encnet", aux=True, se_loss=True, lateral=True, norm_layer=MarkedNorm)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._NormBase)]
    assert norms and all(type(m) is MarkedNorm for m in norms)


def test_head_parameters_split():
    model = build("encnet", aux=True, se_loss=True)
    head = {id(p) for p in model.head_parameters()}
    backbone = {id(p) for p in model.backbone.parameters()}
    assert head and not head & backbone and head | backbone == {id(p) for p in model.parameters()}


def test_pretrained_model_file_round_trip(tmp_path):
    torch.manual_seed(0)
    model = build("psp", aux=True).eval()
    randomize_running_stats(model)
    path = tmp_path / "psp.pth"
    torch.save({"epoch": 3, "state_dict": {"module." + k: v for k, v in model.state_dict().items()}}, path)
    loaded = build("psp", aux=True, pretrained=str(path)).eval()
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(loaded(x)["out"], model(x)["out"], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"psp.pth.*missing keys \(\d+\): aux_classifier"):
        torch.save(build("psp").state_dict(), path)
        build("psp", aux=True, pretrained=path)
    with pytest.raises(FileNotFoundError, match="nothing.pth"):
        build("psp", pretrained=tmp_path / "nothing.pth")
    with pytest.raises(ValueError, match="no published weights for psp"):
        build("psp", pretrained=True)


# --------------------------------------------------------------------------------------------------- backbones
@pytest.mark.parametrize("output_stride, sizes", [(8, (16, 8, 8, 8)), (16, (16, 8, 4, 4)), (32, (16, 8, 4, 2))])
def test_backbone_output_stride(output_stride, sizes):
    backbone = get_backbone("resnet18", output_stride)
    features = backbone(torch.randn(1, 3, 64, 64))
    assert [f.shape[-1] for f in features] == list(sizes)
    assert [f.shape[1] for f in features] == list(backbone.channels) == [64, 128, 256, 512]
    with pytest.raises(ValueError, match="output_stride must be one of"):
        get_backbone("resnet18", 4)


def test_dilation_matches_torchvision_replace_stride_with_dilation():
    for output_stride, replace in ((8, [False, True, True]), (16, [False, False, True])):
        ours = get_backbone("resnext50_32x4d", output_stride)
        theirs = torchvision.models.resnext50_32x4d(replace_stride_with_dilation=replace)
        convs = {n: (m.stride, m.dilation, m.padding) for n, m in theirs.named_modules()
                 if isinstance(m, nn.Conv2d)}
        assert convs == {n: (m.stride, m.dilation, m.padding) for n, m in ours.named_modules()
                         if isinstance(m, nn.Conv2d)}


def test_every_backbone_is_torchvisions_without_classifier():
    for name in (n for n in backbone_list() if hasattr(torchvision.models, n)):  # not ours, timm's ResNeSt, MiT
        with torch.device("meta"):
            backbone = get_backbone(name)
            reference = getattr(torchvision.models, name)()
        head = reference.fc if hasattr(reference, "fc") else reference.classifier
        classifier = sum(p.numel() for p in head.parameters())
        weights = torchvision.models.get_model_weights(name).DEFAULT
        assert sum(p.numel() for p in backbone.parameters()) == weights.meta["num_params"] - classifier, name


@pytest.mark.parametrize("name", ["mobilenet_v3_large", "mobilenet_v3_small"])
def test_mobilenet_backbone_is_torchvisions_features(name, tmp_path):
    """Same keys as torchvision's model (without classifier); c4 equals torchvision's ``features`` output at output
    stride 32, and its ``dilated=True`` variant at 16; the stages sit at strides 4, 8, 16, 32."""
    torch.manual_seed(0)
    reference = getattr(torchvision.models, name)().eval()  # torchvision's BatchNorm: eps 0.001
    randomize_running_stats(reference)
    path = tmp_path / f"{name}.pth"
    torch.save(reference.state_dict(), path)
    x = torch.randn(2, 3, 64, 96)
    ours = get_backbone(name, output_stride=32, pretrained=str(path)).eval()
    features = ours(x)
    assert [f.shape[-1] for f in features] == [24, 12, 6, 3]
    assert tuple(f.shape[1] for f in features) == ours.channels
    torch.testing.assert_close(features[-1], reference.features(x), rtol=0, atol=0)
    dilated = getattr(torchvision.models, name)(dilated=True).eval()
    dilated.load_state_dict(reference.state_dict())
    ours16 = get_backbone(name, output_stride=16, pretrained=str(path)).eval()
    torch.testing.assert_close(ours16(x)[-1], dilated.features(x), rtol=1e-5, atol=1e-5)
    assert [f.shape[-1] for f in get_backbone(name, output_stride=8)(x)] == [24, 12, 12, 12]


def test_vgg_tiny_strides_dilation_and_no_published_weights():
    """Stages at strides 2, 4, 8 and 16 (8 with c4's convs dilated 2 and 4, as many parameters); pretrained=True is
    refused by name rather than attempted."""
    x = torch.randn(2, 3, 64, 96)
    plain, dilated = get_backbone("vgg_tiny", output_stride=16), get_backbone("vgg_tiny", output_stride=8)
    assert [f.shape[-1] for f in plain(x)] == [48, 24, 12, 6]
    assert [f.shape[-1] for f in dilated(x)] == [48, 24, 12, 12]
    assert tuple(f.shape[1] for f in dilated(x)) == dilated.channels == (24, 48, 72, 72)
    assert [m.dilation[0] for m in dilated.layer4.modules() if isinstance(m, nn.Conv2d)] == [2, 4]
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in dilated.parameters())
    with pytest.raises(ValueError, match="output_stride of vgg_tiny must be 8 or 16, got 32"):
        get_backbone("vgg_tiny", output_stride=32)
    with pytest.raises(ValueError, match="vgg_tiny has no published weights; pretrained=True is available for res"):
        get_backbone("vgg_tiny", pretrained=True)


def test_vgg_tiny_s2_moves_the_stride_into_the_stem_with_the_same_parameters_and_strides():
    """``vgg_tiny_s2``: the stem conv has the stride and the first stage's conv none, so no layer runs at full
    resolution (a quarter of vgg_tiny's stem work); the same parameter shapes and feature strides."""
    from encoding.models import backbone
    from encoding.models.flops import count_flops
    x = torch.randn(2, 3, 64, 96)
    full, s2 = get_backbone("vgg_tiny", output_stride=8), get_backbone("vgg_tiny_s2", output_stride=8)
    assert (full.conv1[0].stride, full.layer1[0][0].stride) == ((1, 1), (2, 2))
    assert (s2.conv1[0].stride, s2.layer1[0][0].stride) == ((2, 2), (1, 1))
    assert [f.shape for f in s2(x)] == [f.shape for f in full(x)]
    assert {k: v.shape for k, v in s2.state_dict().items()} == {k: v.shape for k, v in full.state_dict().items()}
    assert s2.channels == full.channels
    assert count_flops(s2, (64, 96)) < count_flops(full, (64, 96))
    with pytest.raises(ValueError, match="stem_stride of vgg_tiny must be 1 or 2, got 4"):
        backbone.VGGTinyBackbone(stem_stride=4)
    with pytest.raises(ValueError, match="vgg_tiny_s2 has no published weights"):
        get_backbone("vgg_tiny_s2", pretrained=True)


def test_unet_decodes_to_the_finest_stage():
    """The U-Net head climbs c4 -> c3 -> c2 -> c1: its logits have c1's size (stride 2 on vgg_tiny, 4 on ResNet)."""
    for backbone, stride in (("vgg_tiny", 2), ("resnet18", 4)):
        model = get_segmentation_model("unet", backbone=backbone, nclass=NCLASS, decoder_channels=(8, 16, 24)).eval()
        features = model.backbone(torch.randn(1, 3, 64, 64))
        assert model.classifier(*features).shape == (1, NCLASS, 64 // stride, 64 // stride)
        assert [m[0].out_channels for m in model.classifier.fuse] == [8, 16, 24]


def test_lighter_head_options_separable_aspp_and_fuse_channels():
    """``separable`` (DeepLabV3+) makes every 3x3 conv of the ASPP and decoder depthwise-separable; ``fuse_channels``
    (FCFPN, UperNet) sets the width of the stride-4 fusing conv. Both keep the output contract and shrink the head."""
    from encoding.models.flops import count_flops
    x = torch.randn(2, 3, 64, 64)
    built = {}  # each network built once: the checks below look again at the same ones
    for name, options in (("deeplabv3plus", dict(separable=True)), ("fcfpn", dict(fuse_channels=128)),
                          ("upernet", dict(fuse_channels=256))):
        plain, light = build(name), build(name, **options)
        built[name], built[name, "light"] = plain, light
        outputs = light(x)
        assert outputs["out"].shape == (2, NCLASS, 64, 64)
        outputs["out"].mean().backward()
        assert all(p.grad is not None for p in light.parameters())
        heads = [sum(p.numel() for p in m.head_parameters()) for m in (plain, light)]
        assert heads[1] < 0.75 * heads[0], (name, heads)
        assert count_flops(light, (64, 64)) < count_flops(plain, (64, 64))
    head = built["deeplabv3plus", "light"].classifier
    spatial = [m for m in head.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    assert spatial and all(m.groups == m.in_channels for m in spatial)
    assert [m.dilation[0] for m in spatial[:3]] == [6, 12, 18]
    fuse = build("upernet", fuse_channels=96).classifier.fuse
    assert fuse[0].out_channels == 96 and fuse[-1].in_channels == 96
    # UperNet's pyramid-pooling branches: c4 / 4 channels each by default (PE's), pool_channels= sets them
    narrow_net = build("upernet", pool_channels=8)
    top, narrow = built["upernet"].classifier.top, narrow_net.classifier.top
    c4 = top[0].branches[0][1].in_channels
    assert [b[1].out_channels for b in top[0].branches] == [c4 // 4] * 4 and top[0].out_channels == 2 * c4
    assert [b[1].out_channels for b in narrow[0].branches] == [8] * 4 and narrow[1].in_channels == c4 + 32
    assert narrow_net(x)["out"].shape == (2, NCLASS, 64, 64)


def test_pretrained_backbone_offline_error_and_cache(offline_hub):
    message = r"ResNet18_Weights.*download\.pytorch\.org.*put the file at .*hub.checkpoints"
    with pytest.raises(RuntimeError, match=message):
        get_backbone("resnet18", pretrained=True)
    # once the file is in the cache, the weights API loads it without network access
    reference = torchvision.models.resnet18()
    url = torchvision.models.ResNet18_Weights.DEFAULT.url
    offline_hub.mkdir(parents=True, exist_ok=True)
    torch.save(reference.state_dict(), offline_hub / os.path.basename(url))
    backbone = get_backbone("resnet18", pretrained=True)
    torch.testing.assert_close(backbone.layer4[1].conv2.weight, reference.layer4[1].conv2.weight, rtol=0, atol=0)


def test_pretrained_backbone_from_file(tmp_path, offline_hub):
    reference = torchvision.models.resnet18()
    path = tmp_path / "r18.pth"
    torch.save(reference.state_dict(), path)
    backbone = get_backbone("resnet18", pretrained=str(path))
    torch.testing.assert_close(backbone.conv1.weight, reference.conv1.weight, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"r18.pth.*ResNetBackbone.*shape mismatch for \d+ key\(s\): layer1"):
        get_backbone("resnet50", pretrained=path)
    torch.save([1, 2, 3], path)
    with pytest.raises(ValueError, match="does not contain a state dict"):
        get_backbone("resnet18", pretrained=path)
    # pretrained=False (the default everywhere) never goes to the hub
    build("fcn")
    assert not offline_hub.exists() or not any(offline_hub.iterdir())


# ------------------------------------------------------------------------------------ torchvision compatibility
@pytest.mark.parametrize("name, factory, weights", [
    ("fcn", fcn_resnet50, FCN_ResNet50_Weights.DEFAULT),
    ("deeplab", deeplabv3_resnet50, DeepLabV3_ResNet50_Weights.DEFAULT),
])
def test_torchvision_segmentation_compatibility(name, factory, weights, offline_hub):
    torch.manual_seed(0)
    reference = factory(weights=None, weights_backbone=None, num_classes=21, aux_loss=True).eval()
    randomize_running_stats(reference)
    ours = get_segmentation_model(name, backbone="resnet50", nclass=21, aux=True).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())
    ours.load_state_dict(reference.state_dict())  # same keys, no mapping
    x = torch.randn(1, 3, 48, 48)
    expected, got = reference(x), ours(x)
    assert list(got) == list(expected)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    # pretrained="torchvision" goes through torchvision's weights API (here: from a pre-filled cache)
    with pytest.raises(RuntimeError, match="could not download"):
        get_segmentation_model(name, nclass=21, aux=True, pretrained="torchvision")
    offline_hub.mkdir(parents=True, exist_ok=True)
    torch.save(reference.state_dict(), offline_hub / os.path.basename(weights.url))
    loaded = get_segmentation_model(name, nclass=21, pretrained=True).eval()  # no aux: aux weights dropped
    assert loaded.aux_classifier is None and torch.equal(loaded(x)["out"], expected["out"])
    with pytest.raises(ValueError, match="predict 21 classes"):
        get_segmentation_model(name, nclass=NCLASS, pretrained="torchvision")


# ------------------------------------------------------------------------------------------------ multi-scale
class PixelLinear(nn.Module):
    """A per-pixel linear map (1x1 conv): translation- and flip-equivariant, unaffected by padding elsewhere."""

    def __init__(self, nclass=4):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, nclass, 1).double()
        self.calls = []

    def forward(self, x):
        self.calls.append(x.clone())
        return {"out": self.conv(x)}


def test_multieval_sliding_windows_stitch_exactly():
    model = PixelLinear()
    image = torch.randn(1, 3, 45, 56, dtype=torch.float64)
    evaluator = MultiEvalModule(model, 4, base_size=56, crop_size=24, scales=(1.0,))
    result = evaluator(image)
    torch.testing.assert_close(result, model.conv(image).detach(), rtol=1e-12, atol=1e-12)
    # windows every int(24 * 2/3) = 16 px: 3 rows (0, 16, 32) x 3 columns (0, 16, 32), each also flipped
    assert len(model.calls) == 18 and all(c.shape == (1, 3, 24, 24) for c in model.calls)
    assert all(torch.equal(b, a.flip(-1)) for a, b in zip(model.calls[::2], model.calls[1::2]))


def test_multieval_scales_windows_and_mean():
    model = PixelLinear()
    image = torch.full((2, 3, 64, 64), 0.3, dtype=torch.float64)
    result = MultiEvalModule(model, 4, base_size=64, crop_size=64, scales=(0.5, 1.0, 1.5))(image)
    # 0.5: 32x32 padded to 64 (1 window); 1.0: 1 window; 1.5: 96x96, stride 42 -> 2 x 2 windows; all flipped
    assert len(model.calls) == 2 * (1 + 1 + 4) and all(c.shape == (2, 3, 64, 64) for c in model.calls)
    assert model.calls[0][0, 0, 31, 31] == 0.3 and model.calls[0][0, 0, 32, 32] == -0.485 / 0.229
    expected = model.conv(image[:, :, :1, :1]).detach().expand(-1, -1, 64, 64)  # the mean over scales, not a sum
    torch.testing.assert_close(result, expected, rtol=1e-12, atol=1e-12)


def test_multieval_pads_small_images_with_black():
    class GlobalMean(nn.Module):
        def forward(self, x):
            return x[:, :1].mean((2, 3), keepdim=True).expand(-1, 2, *x.shape[-2:])

    image = torch.randn(1, 3, 20, 30, dtype=torch.float64)
    result = MultiEvalModule(GlobalMean(), 2, base_size=30, crop_size=40, scales=(1.0,), flip=False)(image)
    pad = -0.485 / 0.229
    expected = (image[0, 0].sum() + pad * (40 * 40 - 20 * 30)) / (40 * 40)
    torch.testing.assert_close(result, expected.expand(1, 2, 20, 30), rtol=1e-12, atol=1e-12)


def test_multieval_flip_averages_mirrored_logits():
    class Ramp(nn.Module):  # logits = column index, whatever the input
        def forward(self, x):
            return torch.arange(x.shape[-1], dtype=x.dtype).expand(x.shape[0], 1, *x.shape[-2:])

    image = torch.randn(1, 3, 16, 16)
    flipped = MultiEvalModule(Ramp(), 1, base_size=16, crop_size=16, scales=(1.0,), flip=True)(image)
    torch.testing.assert_close(flipped, torch.full((1, 1, 16, 16), 7.5))
    plain = MultiEvalModule(Ramp(), 1, base_size=16, crop_size=16, scales=(1.0,), flip=False)(image)
    torch.testing.assert_close(plain, torch.arange(16.0).expand(1, 1, 16, 16))


def test_multieval_on_a_model():
    model = build("fcn").eval()
    evaluator = MultiEvalModule(model, NCLASS, base_size=64, crop_size=48, scales=(0.75, 1.0))
    result = evaluator(torch.randn(1, 3, 50, 70))
    assert result.shape == (1, NCLASS, 50, 70) and not result.requires_grad
    with pytest.raises(ValueError, match=r"B x 3 x H x W"):
        evaluator(torch.randn(3, 50, 70))


# ------------------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_model_on_cuda_matches_cpu(name, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    torch.manual_seed(0)
    se = ARCHITECTURES[name].se_loss
    model = build(name, aux=True, se_loss=se).eval()
    randomize_running_stats(model)
    with torch.no_grad():
        for m in model.modules():  # let the attention branches contribute
            if hasattr(m, "gamma"):
                m.gamma.fill_(0.5)
    x = torch.randn(2, 3, 64, 64)
    expected = model(x)
    got = model.cuda()(x.cuda())
    assert set(got) == set(expected)
    for key in expected:
        torch.testing.assert_close(got[key].cpu(), expected[key], rtol=1e-4, atol=1e-4)
    model.train()
    sum(v.square().mean() for v in model(x.cuda()).values()).backward()
    assert all(p.grad is not None and p.grad.is_cuda for p in model.parameters())
    evaluator = MultiEvalModule(model.eval(), NCLASS, base_size=64, crop_size=48, scales=(0.75, 1.25))
    assert evaluator(x.cuda()).device.type == "cuda"


# ------------------------------------------------------------------ PyTorch-Encoding's model API (issue 23, 9, 10)


def test_pe_keywords_are_accepted_with_one_future_warning():
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = get_segmentation_model("encnet", dataset="pascal_voc", backbone="resnet18", base_size=96,
                                       crop_size=64, mean=[.5, .5, .5], std=[.2, .2, .2], root="~/.encoding/models")
    future = [w for w in caught if issubclass(w.category, FutureWarning)]
    assert len(future) == 1 and "base_size, crop_size, mean, root, std" in str(future[0].message)
    assert future[0].filename == __file__  # points at the caller's line
    assert model.eval()(torch.randn(1, 3, 64, 64))["out"].shape == (1, 21, 64, 64)
    # dilated=False is PE's plain backbone (output stride 32); jpu="JPU" is FastFCN's neck
    assert build("fcn", dilated=False).backbone.output_stride == 32
    assert build("fcn", dilated=True).backbone.output_stride == 8
    assert isinstance(build("fcn", jpu="JPU").neck, encoding.models.JPU)
    with pytest.raises(ValueError, match="no head option bogus"), pytest.warns(FutureWarning, match="base_size"):
        build("encnet", base_size=96, bogus=1)


def test_pe_attribute_names_are_the_same_modules():
    model = build("encnet", aux=True, se_loss=True)
    assert model.pretrained is model.backbone and model.head is model.classifier
    assert model.auxlayer is model.aux_classifier and not hasattr(build("fcn"), "auxlayer")  # PE's: no aux, no name
    assert not any(k.startswith(("pretrained.", "head.", "auxlayer.")) for k in model.state_dict())


def test_pe_tuple_outputs_adapter():
    from encoding.legacy.outputs import pe_tuple, tuple_outputs
    torch.manual_seed(0)
    model = build("encnet", aux=True, se_loss=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        d = model(x)
        assert tuple_outputs(model) is tuple_outputs(model) is model  # in place, idempotent
        pred, se, aux = model(x)
    assert torch.equal(pred, d["out"]) and torch.equal(se, d["se"]) and torch.equal(aux, d["aux"])
    assert pe_tuple({"out": d["out"], "aux": d["aux"]})[1] is d["aux"]
    with pytest.raises(TypeError, match="dict with 'out'"):
        pe_tuple({"logits": d["out"]})
    # PE's training step: a tuple through DataParallelModel into PE's SegmentationLosses
    model.train()
    criterion = DataParallelCriterion(SegmentationLosses(se_loss=True, aux=True, nclass=NCLASS), ["cpu", "cpu"])
    outputs = DataParallelModel(model, ["cpu", "cpu"])(x)
    assert all(isinstance(o, tuple) and len(o) == 3 for o in outputs)
    loss = criterion(outputs, torch.randint(0, NCLASS, (2, 32, 32)))
    assert torch.isfinite(loss)


def test_pretrained_model_list_names_the_presets_with_weights():
    from encoding.models import pretrained_model_list
    with_weights = pretrained_model_list()
    assert set(with_weights) <= set(model_list) and "fcn_resnet50_voc" in with_weights
    assert {p.split("_")[0] for p in with_weights} == {"fcn", "deeplab"}
    assert {p.rsplit("_", 1)[1] for p in with_weights} == {"voc", "aug", "coco"}
    assert len(with_weights) == 12 and "encnet_resnet50_pcontext" not in with_weights
    with pytest.raises(ValueError, match="no published weights for the preset 'encnet_resnet50_pcontext'; presets "
                                         "with published weights: deeplab_resnet101_aug, "):
        get_model("encnet_resnet50_pcontext", pretrained=True)
