"""One description of a network (issue 44): :class:`~encoding.models.network.NetworkSpec` and its one ``build()``,
used by training, ``load_model``, model folders, the memory planner and the web page's plan."""
import ast
import pathlib

import pytest
import torch

from encoding.models.network import NetworkSpec

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The network options that change the built network's parameters (besides ``model`` / ``backbone``).
SPEC = NetworkSpec("deeplabv3plus", 7, backbone="vgg_tiny", aux=True, output_stride=16, head_channels=8)


def _shapes(model):
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _calls(path, names):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) in names]


def test_exactly_one_function_builds_a_network_from_options():
    """Outside ``encoding/models`` (where the builders live and ``NetworkSpec.build`` calls them), no module of the
    package or the scripts calls a network builder: every tool goes through ``NetworkSpec.build``."""
    builders = {"get_segmentation_model", "build_external_model", "_assemble"}
    found = {}
    for path in list((ROOT / "encoding").rglob("*.py")) + list((ROOT / "experiments").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        lines = _calls(path, builders)
        if lines and not rel.startswith("encoding/models/"):
            found[rel] = lines
    assert found == {}
    inside = {p.relative_to(ROOT).as_posix(): _calls(p, builders) for p in (ROOT / "encoding/models").rglob("*.py")}
    callers = sorted(p for p, lines in inside.items() if lines)
    # the network's build, the builders themselves (get_model / get_<arch> / the spec branch)
    assert callers == ["encoding/models/factory.py", "encoding/models/network.py"]


def test_every_tool_builds_the_same_network_from_the_same_options(tmp_path):
    """Head width, output stride and aux of one description reach training's build, load_model of a checkpoint, a
    model folder, the memory tool's step and the web page's plan: the parameters have one set of shapes."""
    from encoding import load_model
    from dataclasses import replace

    from encoding.app.planning import keep_served, plan_argv, served_request
    from encoding.engine.builders import build_model
    from encoding.inference.hub import load_pretrained, save_pretrained
    from encoding.memory.cli import parse_args
    from encoding.memory.report import step_arguments
    from encoding.utils.checkpoint import save_checkpoint

    expected = _shapes(SPEC.build())
    assert _shapes(SPEC.replace(head_channels=None).build()) != expected  # the options change the network
    assert _shapes(build_model("deeplabv3plus", "shapes", backbone="vgg_tiny", aux=True, output_stride=16,
                               head_options={"channels": 8})) == expected
    path = str(tmp_path / "model.pth")  # a train.py checkpoint of the network (shapes: 7 classes)
    save_checkpoint({"model": SPEC.build(), "epoch": 0, "args": dict(
        dataset="shapes", model="deeplabv3plus", backbone="vgg_tiny", aux=True, output_stride=16, head_channels=8,
        crop_size=32, base_size=40)}, path)
    loaded = load_model(path)
    assert _shapes(loaded) == expected
    save_pretrained(loaded, tmp_path / "folder")
    assert _shapes(load_pretrained(str(tmp_path / "folder"))) == expected
    args = parse_args(["--model", "deeplabv3plus", "--backbone", "vgg_tiny", "--aux", "--nclass", "7",
                       "--output-stride", "16", "--head-channels", "8", "--simulate", "2", "--crop-size", "32"])
    network = step_arguments(args)["network"]
    assert network == SPEC and _shapes(network.build()) == expected
    page = parse_args(plan_argv(served_request(loaded.info)) + ["--simulate", "2", "--crop-size", "32"])
    assert step_arguments(page)["network"] == SPEC
    # the Plan button: the form has no head width / output stride box; the served network's are kept
    served = served_request(loaded.info)
    pressed = keep_served(replace(served, head_channels=None, output_stride=None), served)
    assert step_arguments(parse_args(plan_argv(pressed) + ["--simulate", "2"]))["network"] == SPEC
    assert keep_served(replace(served, backbone="resnet18", output_stride=None), served).output_stride is None


def test_the_memory_tool_plans_the_head_width_it_is_given(tmp_path):
    """``--head-channels`` reaches the planner: the simulated peak follows the head's width."""
    from encoding.memory import main

    argv = ["--model", "deeplabv3plus", "--backbone", "vgg_tiny", "--nclass", "3", "--simulate", "2",
            "--crop-size", "32", "--strategies", "ddp", "--batch-size", "2", "--out-dir", str(tmp_path)]
    peaks = {width: main(argv + ["--head-channels", str(width)])["strategies"]["ddp"]["peak_mib"][0]
             for width in (8, 256)}
    assert peaks[256] > peaks[8]


def test_spec_networks_have_no_backbone_and_refuse_a_typed_one(capsys):
    """A spec network is named without a backbone whatever the field says; ``--backbone`` typed beside a spec is
    refused in one line (exit 2) instead of being silently unused."""
    spec = NetworkSpec("torchvision:lraspp_mobilenet_v3_large", 3, backbone="vgg_tiny")
    assert spec.backbone == "" and spec.name == "torchvision:lraspp_mobilenet_v3_large"
    from conftest import load_script

    settings = load_script("options").settings

    with pytest.raises(SystemExit) as stop:
        settings(["--model", "torchvision:lraspp_mobilenet_v3_large", "--backbone", "resnet18"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--backbone resnet18" in err and "no backbone" in err
    assert settings(["--model", "torchvision:lraspp_mobilenet_v3_large"]).options()["model"].startswith("torchvision:")


def test_check_names_the_flags_and_builds_nothing():
    """``check()`` builds on the meta device and quotes the options that give the network."""
    model = SPEC.check()
    assert all(p.device.type == "meta" for p in model.parameters())
    with pytest.raises(ValueError, match=r"^--model deeplabv3plus --backbone nope --output-stride 16 .*: "):
        SPEC.replace(backbone="nope").check()
    with pytest.raises(ValueError, match="class count"):
        NetworkSpec("fcn", 0)
    with pytest.raises(ValueError, match="--recompute heads"):
        NetworkSpec("fcn", 3, recompute="heads")


def test_recompute_is_the_keyword_and_checkpoint_warns():
    """``recompute=`` everywhere; ``checkpoint=`` (its old name) still works with one FutureWarning."""
    from encoding.models import get_segmentation_model
    from encoding.nn.recompute import is_checkpointed

    model = get_segmentation_model("fcn", backbone="vgg_tiny", nclass=3, recompute="all")
    assert is_checkpointed(model.classifier)
    with pytest.warns(FutureWarning, match=r"get_segmentation_model\(checkpoint=...\) is now"):
        old = get_segmentation_model("fcn", backbone="vgg_tiny", nclass=3, checkpoint="all")
    assert is_checkpointed(old.classifier)
    assert NetworkSpec("fcn", 3, backbone="vgg_tiny", recompute=False).recompute == "none"
    assert is_checkpointed(NetworkSpec("fcn", 3, backbone="vgg_tiny", recompute="all").build().classifier)


def test_every_name_is_parsed_in_one_module():
    """Model specs, timm backbones and Hub ids are parsed by ``encoding.names``; the spec parser, the backbone
    builder, the trust gate and the Hub reader use it (the same answers through each)."""
    from encoding import names
    from encoding.models import external, timm_backbones
    from encoding.utils import trust

    assert names.parse_model_spec("torchvision:fcn_resnet50") == ("torchvision", "fcn_resnet50")
    assert names.parse_model_spec("my.mod:build") == ("factory", "my.mod:build")
    with pytest.raises(ValueError, match="a timm model is a backbone"):
        names.parse_model_spec("timm:resnet18")
    assert names.parse_backbone("timm:convnext_tiny") == ("timm", "convnext_tiny")
    assert names.parse_backbone("resnet50") == ("builtin", "resnet50")
    with pytest.raises(ValueError, match="timm:<name"):
        names.parse_backbone("tim:resnet18")
    with pytest.raises(ValueError, match="timm:<name of a timm model>"):
        timm_backbones.get_timm_backbone("timm:")
    assert [names.names_code(n) for n in ("fcn", "torchvision:x", "transformers:/p", "timm:x", "a.b:c")] == \
        [False, False, False, False, True]
    assert trust.names_code is names.names_code and external.parse_model_spec is names.parse_model_spec
    assert names.is_hub_id("user/repo") and not names.is_hub_id("runs/") and not names.is_hub_id("a/b/c")
