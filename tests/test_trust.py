"""Loading someone's model runs no code of theirs (issue 42, section 2): a ``payload.py`` shipped with a model folder,
a Hub repository or a checkpoint (named as a ``module:factory`` network or as a dataset class) is imported by none of
the loaders without the opt-in (one line naming the module and ``trust_code=True`` / ``--trust-code``), and is
imported with it. The payload writes a marker file when imported: the marker is the proof."""
import importlib
import os
import sys
import textwrap

import pytest
import torch

import encoding
from conftest import load_script
from encoding.inference import ModelInfo, save_pretrained
from encoding.models import get_segmentation_model
from encoding.utils.checkpoint import CHECKPOINT_FORMAT
from encoding.utils.trust import UntrustedCode

PAYLOAD = textwrap.dedent('''
    import os
    with open(os.environ["PAYLOAD_MARKER"], "a") as marker:
        marker.write("imported\\n")

    from torch import nn
    from encoding.datasets.shapes import ShapesSegmentation


    def build(num_classes):
        return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, num_classes, 1))


    class PayloadData(ShapesSegmentation):
        """A user's dataset class: the shapes scenes under another name."""
''')
SPEC = "payload:build"


@pytest.fixture
def payload(tmp_path, monkeypatch):
    """``payload.py`` in a folder that is the working directory and on ``sys.path`` (the worst case: importable);
    returns ``marker()``: whether it was imported since the last call (and forgets it, so it is imported afresh)."""
    folder = tmp_path / "shipped"
    folder.mkdir()
    (folder / "payload.py").write_text(PAYLOAD)
    marker = tmp_path / "marker.txt"
    monkeypatch.setenv("PAYLOAD_MARKER", str(marker))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(folder)
    importlib.invalidate_caches()

    def imported():
        was = marker.exists()
        if was:
            marker.unlink()
        sys.modules.pop("payload", None)
        return was

    yield imported
    sys.modules.pop("payload", None)


def _spec_model(payload):
    torch.manual_seed(0)
    model = get_segmentation_model(SPEC, nclass=7).eval()  # the author's own request: imported, no opt-in
    assert payload()
    model.info = ModelInfo.of_dataset("shapes", model=SPEC, backbone="")
    return model


def _one_line_refusal(caught, module="payload"):
    message = str(caught.value)
    assert "\n" not in message and repr(module) in message and "trust_code=True" in message and "--trust-code" in \
        message, message
    assert caught.value.exit_status == 2


def _status(cli, argv, **kwargs):
    """The exit status of a command line (an argparse error exits, run_cli returns)."""
    try:
        return cli(argv, **kwargs)
    except SystemExit as exit:
        return exit.code


def _checkpoint(path, network, **args):
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1, "model": network.state_dict(), "epoch": 0,
                "args": {"dataset": "shapes", "model": SPEC, "backbone": "", **args}}, path)
    return str(path)


def test_model_folder_runs_no_code_without_the_opt_in(tmp_path, payload):
    folder = str(save_pretrained(_spec_model(payload), tmp_path / "shared"))
    card = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    assert "module `payload`" in card and "trust_code=True" in card  # the card says what loading it needs
    with pytest.raises(UntrustedCode) as caught:
        encoding.load_model(folder)
    _one_line_refusal(caught)
    assert not payload()
    model = encoding.load_model(folder, trust_code=True)
    assert payload() and model(torch.rand(1, 3, 16, 16))["out"].shape == (1, 7, 16, 16)


def test_hub_repository_from_the_cache_runs_no_code_without_the_opt_in(tmp_path, payload, monkeypatch):
    pytest.importorskip("huggingface_hub")
    import huggingface_hub.constants as constants
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--payload"
    save_pretrained(_spec_model(payload), repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # no network: the cache only
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(UntrustedCode) as caught:
        encoding.load_model("someone/payload")
    _one_line_refusal(caught)
    assert not payload()
    encoding.load_model("someone/payload", trust_code=True)
    assert payload()


def test_checkpoint_runs_no_code_without_the_opt_in(tmp_path, payload):
    path = _checkpoint(tmp_path / "model_best.pth", _spec_model(payload))
    with pytest.raises(UntrustedCode) as caught:
        encoding.load_model(path)
    _one_line_refusal(caught)
    with pytest.raises(UntrustedCode):  # naming the spec yourself with a checkpoint's weights: the same opt-in
        encoding.load_model(path, model=SPEC)
    assert not payload()
    model = encoding.load_model(path, trust_code=True)
    assert payload() and model.info.options["model"] == SPEC


def test_test_py_and_export_run_no_code_without_trust_code(tmp_path, payload, capsys):
    path = _checkpoint(tmp_path / "model_best.pth", _spec_model(payload), crop_size=32, base_size=40)
    test_cli = load_script("test").cli
    assert _status(test_cli, ["--resume", path, "--workers", "0", "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'payload'" in err[0] and "--trust-code" in err[0], err
    assert not payload()
    from encoding.export.cli import cli as export_cli
    output = str(tmp_path / "m.pt2")
    assert _status(export_cli, ["--resume", path, "--output", output]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'payload'" in err[0] and "--trust-code" in err[0], err
    assert not payload() and not os.path.exists(output)
    assert export_cli(["--resume", path, "--output", output, "--static", "--trust-code"]) == 0
    assert payload() and os.path.isfile(output)


def test_demo_py_runs_no_code_without_trust_code(tmp_path, payload, capsys):
    from PIL import Image
    path = _checkpoint(tmp_path / "model_best.pth", _spec_model(payload), crop_size=32, base_size=40)
    image = str(tmp_path / "image.png")
    Image.new("RGB", (24, 20), (120, 30, 200)).save(image)
    demo_cli = load_script("demo").cli
    argv = [image, "--resume", path, "--out-dir", str(tmp_path / "demo")]
    assert _status(demo_cli, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'payload'" in err[0] and "--trust-code" in err[0], err
    assert not payload() and not os.path.exists(tmp_path / "demo" / "image_mask.png")
    assert _status(demo_cli, argv + ["--trust-code"]) == 0
    assert payload() and os.path.isfile(tmp_path / "demo" / "image_mask.png")


def test_checkpoint_dataset_class_runs_no_code_without_trust_code(tmp_path, payload, capsys, tiny_shapes):
    """A checkpoint of a user's dataset records its class path; test.py imports it only with --trust-code."""
    from encoding.datasets import datasets
    path = _checkpoint(tmp_path / "model_best.pth", get_segmentation_model("fcn", nclass=7, backbone="vgg_tiny"),
                       model="fcn", backbone="vgg_tiny", dataset="payload_data", dataset_class="payload:PayloadData",
                       crop_size=32, base_size=40)
    test_cli = load_script("test").cli
    assert _status(test_cli, ["--resume", path, "--workers", "0", "--limit", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'payload'" in err[0] and "--trust-code" in err[0], err
    assert not payload()
    with pytest.raises(UntrustedCode) as caught:
        encoding.load_model(path)
    _one_line_refusal(caught)
    assert not payload()
    try:
        scores = load_script("test").main(["--resume", path, "--trust-code", "--workers", "0", "--limit", "2"],
                                          data=tiny_shapes[1])
        assert payload() and "mIoU" in scores
    finally:
        datasets.pop("payload_data", None)


@pytest.mark.parametrize("module", ["encoding.export.__main__", "encoding.datasets.scan.__main__",
                                    "encoding.app.cli"])
def test_a_dataset_class_in_the_packages_tools_is_named_code(tmp_path, module):
    """Only encoding.datasets holds the package's own dataset classes: a checkpoint naming another module of the
    package (a tool's __main__ ran that tool at import: the export CLI on the caller's argv) is refused like
    anyone's, before the import."""
    entry_point = module.endswith(".__main__")  # imported by nothing else: its absence proves the refusal came first
    if entry_point:
        sys.modules.pop(module, None)
    path = _checkpoint(tmp_path / "model_best.pth", get_segmentation_model("fcn", nclass=7, backbone="vgg_tiny"),
                       model="fcn", backbone="vgg_tiny", dataset="mine", dataset_class=f"{module}:Data")
    with pytest.raises(UntrustedCode) as caught:
        encoding.load_model(path)
    _one_line_refusal(caught, module)
    assert not entry_point or module not in sys.modules


def test_built_in_architectures_need_no_opt_in(tmp_path, payload):
    """torchvision: networks (and registry architectures) name no code: loaded without the opt-in."""
    torch.manual_seed(0)
    model = get_segmentation_model("torchvision:lraspp_mobilenet_v3_large", nclass=3).eval()
    model.info = ModelInfo.of_dataset("shapes", model="torchvision:lraspp_mobilenet_v3_large", backbone="",
                                      classes=["a", "b", "c"], palette=[[0, 0, 0], [1, 1, 1], [2, 2, 2]])
    loaded = encoding.load_model(str(save_pretrained(model, tmp_path / "tv")))
    assert "## Code" not in open(tmp_path / "tv" / "README.md", encoding="utf-8").read()
    x = torch.rand(1, 3, 32, 32)
    torch.testing.assert_close(loaded(x)["out"], model(x)["out"])
    assert not payload()


def test_the_authors_own_training_request_needs_no_opt_in(payload):
    """train.py --model payload:build and get_segmentation_model are the user's own request: imported."""
    get_segmentation_model(SPEC, nclass=2)
    assert payload()


def test_the_gate_follows_the_innermost_reading():
    from encoding.utils.trust import allow_import, check_trusted, reading
    allow_import("someones", "the model spec 'someones:build'")  # outside any reading: the user's own request
    with reading("shared/model", trust_code=False):
        with pytest.raises(UntrustedCode, match=r"^shared/model names code to run: .*'someones'"):
            allow_import("someones", "the model spec 'someones:build'")
        allow_import("encoding.datasets.shapes", "the dataset class")  # the package's own: no code of theirs
        allow_import("someones", "the model spec", trust_code=True)    # an explicit opt-in
        with reading("mine", trust_code=True):
            allow_import("someones", "the model spec")
    check_trusted({"model": "torchvision:fcn_resnet50", "dataset_class": "encoding.datasets.ade20k:ADE20K"}, "x",
                  trust_code=False)
    with pytest.raises(UntrustedCode, match="'evil'"):
        check_trusted({"model": "fcn", "dataset_class": "evil:Data"}, "x", trust_code=False)


def test_a_config_file_naming_code_needs_trust_code_on_the_command_line(tmp_path, payload, capsys):
    """train.py --config FILE: a file (shared, downloaded) that names a module:factory network imported it with no
    opt-in. Refused in one line, nothing imported; --trust-code on the command line runs it (the
    file cannot opt in for itself); --model on the command line is the user's own request."""
    from encoding.config import ConfigError
    from encoding.config.resolve import resolve

    shared = tmp_path / "shared.yaml"
    shared.write_text(f"model: {SPEC}\ntrust-code: true\n")
    with pytest.raises(ConfigError, match="key 'trust-code' cannot be set in a file .*--trust-code on the command"):
        resolve("train", ["--config", str(shared)])
    shared.write_text(f"model: {SPEC}\n")
    with pytest.raises(UntrustedCode) as caught:
        resolve("train", ["--config", str(shared)])
    _one_line_refusal(caught)
    assert f"config file {shared}" in str(caught.value) and not payload()
    assert resolve("train", ["--config", str(shared), "--trust-code"]).options()["model"] == SPEC
    assert resolve("train", ["--config", str(shared), "--model", "unet"]).options()["model"] == "unet"
    assert not payload()  # resolving imports nothing: the network is built later


def test_a_transformers_folder_named_by_data_cannot_run_its_own_code(tmp_path, monkeypatch):
    """A checkpoint naming transformers:FOLDER whose config.json maps its classes to the folder's own code
    (auto_map): transformers asked "run the custom code? [y/N]" on stdin, so an answer ran it. Without the opt-in
    it is loaded with trust_remote_code=False and refused in one line (UntrustedCode), nothing imported."""
    import io
    import json

    folder = tmp_path / "remote"
    folder.mkdir()
    marker = tmp_path / "ran.txt"
    (folder / "config.json").write_text(json.dumps({"auto_map": {"AutoConfig": "evilcfg.EvilConfig"},
                                                    "model_type": "evil-unknown"}))
    (folder / "evilcfg.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n"
                                       "from transformers import PretrainedConfig\n"
                                       "class EvilConfig(PretrainedConfig):\n    model_type = 'evil-unknown'\n")
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1, "model": {}, "epoch": 0,
                "args": {"dataset": "shapes", "model": f"transformers:{folder}"}}, tmp_path / "ck.pth")
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # whoever answers the prompt
    with pytest.raises(UntrustedCode) as caught:
        encoding.load_model(str(tmp_path / "ck.pth"))
    assert "\n" not in str(caught.value) and "auto_map" in str(caught.value) and "--trust-code" in str(caught.value)
    assert not marker.exists()


@pytest.mark.parametrize("where", ["top", "backbone"])
def test_a_shared_folders_stored_transformers_config_cannot_run_its_own_code(tmp_path, monkeypatch, where):
    """A model folder (config.json + model.safetensors) whose stored transformers config maps a network to code
    beside it (auto_map, also in a backbone's config): building its network asked transformers' prompt, and an
    answer ran the folder's file. Refused in one line without the opt-in, nothing imported."""
    import io
    import json

    import safetensors.torch

    folder = tmp_path / "shared"
    folder.mkdir()
    marker = tmp_path / "ran.txt"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n"
                                    "from transformers import PreTrainedModel\n"
                                    "class Evil(PreTrainedModel):\n    pass\n")
    mapped = {"auto_map": {"AutoModelForSemanticSegmentation": "evil.Evil", "AutoBackbone": "evil.Evil"}}
    stored = {"model_type": "bert", "_name_or_path": str(folder),
              **(mapped if where == "top" else {"backbone_config": {"model_type": "resnet", **mapped}})}
    info = {"dataset": "shapes", "classes": ["a", "b"], "palette": [[0, 0, 0], [1, 1, 1]], "mean": [0.5] * 3,
            "std": [0.5] * 3, "base_size": 64, "crop_size": 32, "options": {"model": "transformers:anything"}}
    (folder / "config.json").write_text(json.dumps({"format": "encoding-model", "version": 1, "info": info,
                                                    "transformers_config": stored}))
    safetensors.torch.save_file({"x": torch.zeros(1)}, str(folder / "model.safetensors"))
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))  # whoever answers the prompt
    with pytest.raises(UntrustedCode) as caught:
        encoding.load_model(str(folder))
    _one_line_refusal(caught, module="evil.Evil")
    assert "auto_map" in str(caught.value) and not marker.exists()
