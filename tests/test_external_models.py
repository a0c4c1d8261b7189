"""Issue 34, item 3: any network by name (torchvision:NAME, transformers:PATH, module:factory), its outputs through
one adapter, trained / evaluated / reloaded / exported / planned through the toolkit's own paths."""
import importlib
import os
import re
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
                         ("timm:resnet18", "--backbone timm:resnet18"),
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
    model = encoding.load_model(checkpoint, trust_code=True)  # the checkpoint names code: the user trusts it
    assert isinstance(model, ExternalModel) and model.spec == factory_module
    assert model.info.options["model"] == factory_module and model.info.num_classes == 7
    labels = encoding.segment(model, torch.rand(3, 37, 41))
    assert labels.shape == (37, 41)
    scores = load_script("test").main(["--resume", checkpoint, "--trust-code", "--workers", "0", "--limit", "4",
                                       "--out-dir", str(tmp_path / "eval")], data=tiny_shapes[1])
    assert set(scores) >= {"mIoU", "pixAcc"}
    from encoding.export.cli import main as export_main
    export_main(["--resume", checkpoint, "--trust-code", "--format", "exported", "--output", str(tmp_path / "m.pt2")])
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


BAD_OUTPUTS = textwrap.dedent('''
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Net(nn.Module):
        def __init__(self, num_classes, kind):
            super().__init__()
            self.num_classes, self.kind = num_classes, kind
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            if self.kind == "flat":
                return y.mean((2, 3))[:, :self.num_classes]                   # a classifier's vector
            if self.kind == "channels":
                return y[:, : self.num_classes + 1]                           # one channel too many
            if self.kind == "coarse":
                return F.adaptive_avg_pool2d(y, 1)[:, :self.num_classes]      # 1 x 1: no map
            return F.avg_pool2d(y, 4)[:, :self.num_classes]                   # stride 4: resized, as SegFormer's

    def build(num_classes, kind="stride4"):
        return Net(num_classes, kind)
''')


@pytest.fixture
def output_module(tmp_path, monkeypatch):
    (tmp_path / "bad_outputs.py").write_text(BAD_OUTPUTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "bad_outputs", raising=False)
    return "bad_outputs:build"


@pytest.mark.parametrize("kind,shape", [("flat", "[2, 5]"), ("channels", "[2, 6, 64, 64]"),
                                        ("coarse", "[2, 5, 1, 1]")])
def test_spec_output_that_is_no_map_of_the_classes_is_one_line(output_module, kind, shape):
    """Before: a 45-line traceback ('a bug'). Now one line naming the spec and the shape it returned."""
    model = get_segmentation_model(output_module, nclass=5, kind=kind)
    with pytest.raises(ValueError) as caught:
        model(torch.rand(2, 3, 64, 64))
    message = str(caught.value)
    assert "\n" not in message and output_module in message and shape in message, message
    assert caught.value.exit_status == 2


def test_spec_output_at_a_lower_resolution_is_resized(output_module):
    out = get_segmentation_model(output_module, nclass=5)(torch.rand(2, 3, 64, 48))["out"]
    assert out.shape == (2, 5, 64, 48)


SPEC = "torchvision:lraspp_mobilenet_v3_large"


@pytest.mark.parametrize("option,value,named", [
    ("se_loss", True, "--se-loss"), ("output_stride", 16, "--output-stride"), ("jpu", True, "jpu"),
    ("pretrained", "weights.pth", "pretrained"), ("pretrained_backbone", "backbone.pth", "--pretrained-backbone"),
    ("channels", 64, "--head-channels"), ("dilated", False, "dilated"), ("norm_layer", torch.nn.GroupNorm, "GroupNorm"),
    ("recompute", "everything", "--recompute")])
def test_every_network_option_on_a_spec_is_applied_or_refused(option, value, named):
    """No option is accepted and ignored on a spec network: those that cannot apply are one line naming them."""
    with pytest.raises(ValueError, match=named) as caught:
        get_segmentation_model(SPEC, nclass=3, **{option: value})
    assert "\n" not in str(caught.value) and SPEC in str(caught.value)


def test_aux_and_factory_options_apply_to_spec_networks(factory_module):
    torch.manual_seed(0)
    with_aux = get_segmentation_model(SPEC.replace("lraspp", "deeplabv3"), nclass=3, aux=True).eval()
    assert set(with_aux(torch.rand(1, 3, 32, 32))) == {"out", "aux"}
    wide = get_segmentation_model(factory_module, nclass=3, width=12)  # a keyword the factory takes: applied
    assert wide.net.conv.out_channels == 12
    with pytest.raises(ValueError, match="takes no option channels"):
        get_segmentation_model(factory_module, nclass=3, channels=12)  # --head-channels: the factory has none


def test_recompute_wraps_a_spec_networks_backbone_blocks_exactly():
    """Before: --recompute backbone on a spec network was accepted and did nothing. Now its backbone's blocks (and
    with 'all' its heads) run under the toolkit's exact recomputation: the same loss, gradients and BatchNorm
    statistics as without it."""
    from encoding.nn.recompute import is_checkpointed
    models = {}
    for policy in ("none", "backbone", "all"):
        torch.manual_seed(0)
        models[policy] = get_segmentation_model(SPEC, nclass=3, recompute=policy).train()
    counts = {p: sum(is_checkpointed(m) for m in models[p].modules()) for p in models}
    assert counts["none"] == 0 < counts["backbone"] < counts["all"]
    assert all(is_checkpointed(b) for b in models["backbone"].net.backbone.children()
               if type(b).__name__ == "InvertedResidual")
    x = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    grads, stats = {}, {}
    for policy, model in models.items():
        model(x)["out"].square().mean().backward()
        grads[policy] = [p.grad.clone() for p in model.parameters()]
        stats[policy] = [b.clone() for b in model.buffers()]
    for policy in ("backbone", "all"):
        for a, b in zip(grads["none"], grads[policy]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert all(torch.equal(a, b) for a, b in zip(stats["none"], stats[policy]))


def test_recompute_on_a_spec_network_without_backbone_is_refused(factory_module):
    with pytest.raises(ValueError, match="no backbone") as caught:
        get_segmentation_model(factory_module, nclass=3, recompute="backbone")
    assert "\n" not in str(caught.value) and factory_module in str(caught.value)


def test_memory_planner_plans_what_recompute_builds_on_a_spec(tmp_path):
    """The planner builds through the same path: its peak with --recompute backbone is below none's."""
    from encoding.memory.cli import main as memory_main
    peaks = {}
    for policy in ("none", "backbone"):
        report = memory_main(["--model", SPEC, "--dataset", "shapes", "--simulate", "1", "--crop-size", "160",
                              "--strategies", "balanced", "--recompute", policy, "--out-dir", str(tmp_path / policy)])
        peaks[policy] = report["strategies"]["balanced"]["peak_mib"][0]
    assert peaks["backbone"] < 0.8 * peaks["none"], peaks


def test_no_phantom_backbone_in_names_of_spec_networks():
    from encoding.models.external import network_flags, network_name
    assert network_name(SPEC, "vgg_tiny") == SPEC and network_flags(SPEC, "resnet50") == f"--model {SPEC}"
    assert network_name("fcn", "resnet50") == "fcn-resnet50"
    assert network_flags("fcn", "resnet50") == "--model fcn --backbone resnet50"


def test_memory_report_and_errors_name_no_backbone_for_a_spec(tmp_path, capsys):
    from encoding.memory.cli import main as memory_main
    memory_main(["--model", SPEC, "--dataset", "shapes", "--simulate", "1", "--crop-size", "32", "--strategies",
                 "balanced", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert f"{SPEC}," in out and f"{SPEC}-" not in out
    from encoding.engine.assemble import check_network
    with pytest.raises(ValueError) as caught:
        check_network("shapes", SPEC, "vgg_tiny", se_loss=True)
    assert "--backbone" not in str(caught.value) and "vgg_tiny" not in str(caught.value)


def test_factory_imports_from_the_working_directory(tmp_path, monkeypatch):
    """`--model my_models.tiny:build` run from the folder holding my_models/ works as `python -m` would; a failed
    import says where it looked."""
    (tmp_path / "cwd_models").mkdir()
    (tmp_path / "cwd_models" / "__init__.py").write_text("")
    (tmp_path / "cwd_models" / "tiny.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd(), str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cwd_models", raising=False)
    monkeypatch.delitem(sys.modules, "cwd_models.tiny", raising=False)
    model = get_segmentation_model("cwd_models.tiny:build", nclass=3)
    assert model(torch.rand(1, 3, 16, 16))["out"].shape == (1, 3, 16, 16)
    assert str(tmp_path) not in sys.path  # the working directory was importable for the import only
    with pytest.raises(ValueError) as caught:
        get_segmentation_model("cwd_modelz.tiny:build", nclass=3)
    assert f"looked in the working directory {tmp_path}" in str(caught.value)


def test_relative_transformers_path_is_recorded_absolute(tmp_path, monkeypatch):
    from encoding.config import resolve
    monkeypatch.chdir(tmp_path)
    model = resolve("train", ["--model", "transformers:segformer"]).options()["model"]
    assert model == f"transformers:{tmp_path / 'segformer'}"
    assert resolve("train", ["--model", "fcn"]).options()["model"] == "fcn"


def test_head_lr_mult_reaches_a_spec_networks_heads_or_is_refused(tmp_path, factory_module, tiny_shapes, capsys):
    """--head-lr-mult split the groups on the top module's ``backbone``: a spec network (wrapped) gave one group, so
    the multiplier (and --pretrained-backbone's rule of 10) applied to nothing. Its network's backbone now splits
    them; a network without one refuses a multiplier the user asks for."""
    from encoding.config import ConfigError
    from encoding.engine import TrainingConfig, builders, run_training

    net = get_segmentation_model("torchvision:lraspp_mobilenet_v3_large", nclass=3)
    groups = builders.param_groups(net)
    backbone = {id(p) for p in net.net.backbone.parameters()}
    assert len(groups) == 2 and {id(p) for p in groups[0]["params"]} == backbone
    optimizer = builders.build_optimizer(net, 0.01)
    scheduler = builders.build_scheduler(optimizer, "poly", 0.01, 1, 10, head_lr_mult=10)
    assert scheduler.get_last_lr() == pytest.approx([0.01, 0.1])
    with pytest.raises(SystemExit) as stopped:  # on the command line, before any data is built or run written
        load_script("train").main(TINY + ["--output-dir", str(tmp_path / "runs"), "--model", factory_module,
                                          "--head-lr-mult", "5"], datasets=tiny_shapes)
    assert stopped.value.code == 2 and not (tmp_path / "runs").exists()
    assert "--head-lr-mult 5.0: my_models.tiny:build has no backbone module" in capsys.readouterr().err
    config = TrainingConfig(model=factory_module, output_stride=None, head_lr_mult=5.0,
                            output_dir=str(tmp_path / "api"), sources={"head_lr_mult": "command line"})
    with pytest.raises(ConfigError, match=r"--head-lr-mult 5.0: my_models.tiny:build has no backbone module"):
        run_training(config)
    shared = tmp_path / "shared.yaml"  # a --config file's value was taken and applied to nothing
    shared.write_text("head-lr-mult: 5\n")
    with pytest.raises(SystemExit) as stopped:
        load_script("train").main(TINY + ["--output-dir", str(tmp_path / "runs"), "--model", factory_module,
                                          "--config", str(shared)], datasets=tiny_shapes)
    assert stopped.value.code == 2 and not (tmp_path / "runs").exists()
    assert f"--head-lr-mult 5.0 (config file {shared}): my_models.tiny:build has no backbone module" in \
        capsys.readouterr().err


def test_a_spec_networks_backbone_is_refused_where_it_is_asked_for(tmp_path):
    """A model spec has no backbone of the toolkit's: --backbone was refused on the command line but taken from a
    --config file and recorded in the run's config.yaml, never used; the recipe's was recorded for every spec run.
    Refused in a file too; none from the recipe; a file holding the recipe's (what runs recorded) still replays."""
    from encoding.config import ConfigError
    from encoding.config.resolve import resolve

    assert resolve("train", ["--model", SPEC]).options()["backbone"] is None
    shared = tmp_path / "shared.yaml"
    for argv, where in ((["--backbone", "resnet101"], ""), (["--config", str(shared)], f" (config file {shared})")):
        shared.write_text("backbone: resnet101\n")
        with pytest.raises(ConfigError, match=rf"^--backbone resnet101{re.escape(where)}: the model spec {SPEC} "
                                              "has no backbone of the toolkit's"):
            resolve("train", ["--model", SPEC, *argv])
    recorded = resolve("train", []).options()["backbone"]  # the shapes recipe's: what a spec run's config.yaml held
    shared.write_text(f"backbone: {recorded}\nmodel: {SPEC}\n")
    assert resolve("train", ["--config", str(shared), "--trust-code"]).options()["model"] == SPEC
