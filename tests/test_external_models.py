"""Issue 34, item 3: any network by name (torchvision:NAME, transformers:PATH, module:factory), its outputs through
one adapter, trained / evaluated / reloaded / exported / planned through the toolkit's own paths."""
import importlib
import os
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import encoding
from conftest import TINY, load_script
from encoding.models import get_segmentation_model
from encoding.models.external import (ExternalModel, build_external_model, parse_model_spec,
                                      segmentation_output)

FACTORY = textwrap.dedent('''
    import torch
    from torch import nn

    def build(num_classes, width=8):
        """A tiny network returning (logits at half resolution, aux logits)."""
        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, width, 3, stride=2, padding=1)
                self.bn = nn.BatchNorm2d(width)
                self.head = nn.Conv2d(width, num_classes, 1)
                self.aux = nn.Conv2d(width, num_classes, 1)

            def forward(self, x):
                y = torch.relu(self.bn(self.conv(x)))
                return self.head(y), self.aux(y)
        return Tiny()

    def not_a_module(num_classes):
        return 3
''')


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    (tmp_path / "my_models").mkdir()
    (tmp_path / "my_models" / "__init__.py").write_text("")
    (tmp_path / "my_models" / "tiny.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "my_models" or m.startswith("my_models.")]:
        monkeypatch.delitem(sys.modules, name)  # another test's (or a docs example's) my_models is not this one
    importlib.invalidate_caches()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "my_models.tiny:build"


def test_spec_parsing_and_errors(factory_module):
    assert parse_model_spec("torchvision:deeplabv3_resnet50") == ("torchvision", "deeplabv3_resnet50")
    assert parse_model_spec("transformers:/a/b") == ("transformers", "/a/b")
    assert parse_model_spec("pkg.mod:build").kind == "factory"
    for bad, message in [("pkg.mod:", "expected"), ("1pkg:build", "package.module:function"),
                         ("torchvision:no_such_net", "no model"), ("transformers:/no/such/dir", "no such folder"),
                         ("no_such_pkg_xyz.mod:build", "cannot import"), ("my_models.tiny:missing", "cannot import"),
                         ("my_models.tiny:not_a_module", "not an nn.Module")]:
        with pytest.raises(ValueError, match=message) as info:
            build_external_model(bad, 3)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="auxiliary head"):
        build_external_model("torchvision:lraspp_mobilenet_v3_large", 3, aux=True)


def test_one_adapter_for_every_output_kind():
    from transformers.modeling_outputs import SemanticSegmenterOutput
    logits, aux = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    size = torch.Size([8, 10])
    up = F.interpolate(logits, size=size, mode="bilinear", align_corners=False)
    up_aux = F.interpolate(aux, size=size, mode="bilinear", align_corners=False)
    for output in (logits, {"out": logits}, SemanticSegmenterOutput(logits=logits), [logits]):
        result = segmentation_output(output, size)
        assert list(result) == ["out"] and torch.equal(result["out"], up)
    for output in ({"out": logits, "aux": aux}, (logits, aux)):
        result = segmentation_output(output, size)
        assert torch.equal(result["out"], up) and torch.equal(result["aux"], up_aux)
    assert segmentation_output(logits, torch.Size([4, 5]))["out"] is logits  # already at the input size
    with pytest.raises(TypeError, match="keys \\['boxes'\\]"):
        segmentation_output({"boxes": logits}, size)


def test_torchvision_builders_get_num_classes_and_aux():
    with torch.device("meta"):  # the shapes only: deeplabv3_resnet50 is large
        model = get_segmentation_model("torchvision:deeplabv3_resnet50", dataset="shapes", aux=True)
        output = model(torch.empty(2, 3, 33, 35))
    assert isinstance(model, ExternalModel) and model.net.aux_classifier is not None
    assert output["out"].shape == output["aux"].shape == (2, 7, 33, 35)
    torch.manual_seed(0)
    small = build_external_model("torchvision:lraspp_mobilenet_v3_large", 4).eval()
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(small(x)["out"], small.net(x)["out"])


def test_transformers_folder_logits_upsampled(tmp_path):
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    torch.manual_seed(0)
    config = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                             patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                             decoder_hidden_size=16, num_labels=5)
    hf = SegformerForSemanticSegmentation(config).eval()
    hf.save_pretrained(tmp_path / "segformer")
    model = build_external_model(f"transformers:{tmp_path / 'segformer'}", 5).eval()
    x = torch.randn(2, 3, 32, 48)
    out = model(x)["out"]
    assert out.shape == (2, 5, 32, 48)
    expected = F.interpolate(hf(pixel_values=x).logits, size=(32, 48), mode="bilinear", align_corners=False)
    torch.testing.assert_close(out, expected)
    resized = build_external_model(f"transformers:{tmp_path / 'segformer'}", 3)  # the classifier resized
    assert resized(x)["out"].shape == (2, 3, 32, 48)


def test_factory_spec_trains_tests_reloads_exports_and_plans(tmp_path, factory_module, tiny_shapes):
    out = str(tmp_path / "runs")
    torch.manual_seed(0)
    result = load_script("train").main(TINY + ["--output-dir", out, "--model", factory_module],
                                       datasets=tiny_shapes)
    assert 0.0 <= result["mIoU"] <= 1.0
    run_dir = os.path.join(out, "shapes", "my_models.tiny_build", "default")
    checkpoint = os.path.join(run_dir, "model_best.pth")
    model = encoding.load_model(checkpoint)
    assert isinstance(model, ExternalModel) and model.spec == factory_module
    assert model.info.options["model"] == factory_module and model.info.num_classes == 7
    labels = encoding.segment(model, torch.rand(3, 37, 41))
    assert labels.shape == (37, 41)
    scores = load_script("test").main(["--resume", checkpoint, "--workers", "0", "--limit", "4",
                                       "--out-dir", str(tmp_path / "eval")], data=tiny_shapes[1])
    assert set(scores) >= {"mIoU", "pixAcc"}
    from encoding.export.cli import main as export_main
    export_main(["--resume", checkpoint, "--format", "exported", "--output", str(tmp_path / "m.pt2")])
    program = torch.export.load(str(tmp_path / "m.pt2"))
    x = torch.rand(1, 3, 32, 32)
    exported = program.module()(x)
    exported = exported["out"] if isinstance(exported, dict) else exported
    torch.testing.assert_close(exported, model(x)["out"], rtol=1e-4, atol=1e-4)
    planned = encoding.memory.plan(model, nn.CrossEntropyLoss(), crop=32, batch=2, num_devices=1,
                                   output_key="out", round_to=1)
    assert planned.peaks["balanced"][0] > 0


def test_memory_tool_plans_a_spec(tmp_path):
    from encoding.memory.cli import main as memory_main
    report = memory_main(["--model", "torchvision:lraspp_mobilenet_v3_large", "--dataset", "shapes", "--simulate",
                          "2", "--crop-size", "48", "--strategies", "balanced", "--out-dir", str(tmp_path)])
    assert report["config"]["model"] == "torchvision:lraspp_mobilenet_v3_large"
    peaks = report["strategies"]["balanced"]["peak_mib"]
    assert len(peaks) == 2 and all(p > 0 for p in peaks)


def test_spec_models_synchronise_batchnorm_across_replicas():
    """Before: ``sync_bn`` was dropped for a spec (each replica normalised its own share; only replica 0's three
    samples reached the running statistics). Now its BatchNorm layers become SyncBatchNorm, as registry models are
    built: 2 CPU replicas with a 3/2 split equal the plain model on the whole batch (float64)."""
    from encoding.engine.builders import build_model
    from encoding.nn import SyncBatchNorm
    from encoding.parallel import DataParallelModel

    spec = "torchvision:lraspp_mobilenet_v3_large"
    plain = build_model(spec, "shapes", nclass=3).double().train()
    synced = build_model(spec, "shapes", nclass=3, sync_bn=True).double().train()
    synced.load_state_dict(plain.state_dict())
    assert sum(isinstance(m, SyncBatchNorm) for m in synced.modules()) == 47
    x = torch.randn(5, 3, 64, 64, dtype=torch.float64)
    expected = plain(x)["out"]
    outputs = DataParallelModel(synced, ["cpu", "cpu"], chunk_sizes=[3, 2])(x)
    torch.testing.assert_close(torch.cat([o["out"] for o in outputs]), expected, rtol=0, atol=1e-6)
    for (name, mine), theirs in zip(synced.named_buffers(), plain.buffers()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6, msg=name)


def test_spec_batchnorm_that_cannot_be_synchronised_is_named():
    """A BatchNorm subclass with a forward of its own is left as it is, with a warning naming it."""
    from encoding.models.external import sync_batchnorm

    class ScaledBatchNorm(nn.BatchNorm2d):
        def forward(self, x):
            return 2 * super().forward(x)

    net = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), ScaledBatchNorm(4))
    with pytest.warns(UserWarning, match=r"1 normalisation layer.*2 \(ScaledBatchNorm\)"):
        net = sync_batchnorm(net, "my.module:build")
    assert [type(m).__name__ for m in net] == ["Conv2d", "SyncBatchNorm", "ScaledBatchNorm"]
    with pytest.raises(ValueError, match="norm_layer=GroupNorm cannot be applied"):
        build_external_model("torchvision:lraspp_mobilenet_v3_large", 3, norm_layer=nn.GroupNorm)
