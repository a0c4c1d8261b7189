"""Issue 34, item 5: save_pretrained -> load_model -> segment, from a folder and from a Hub repository in a populated
cache read with HF_HUB_OFFLINE=1; nothing in the folder or on the way is a pickle."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import encoding
from encoding.inference import ModelInfo, save_pretrained
from encoding.models import get_segmentation_model

pytest.importorskip("safetensors")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model(name="fcn", **options):
    torch.manual_seed(0)
    model = get_segmentation_model(name, dataset="shapes", backbone="vgg_tiny", **options).eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so a missed buffer changes the labels
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    classes = tuple(f"thing_{i}" for i in range(7))
    palette = tuple((10 * i, 255 - 10 * i, 3 * i) for i in range(7))
    model.info = ModelInfo("my_unregistered_data", classes, palette, mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3),
                           base_size=40, crop_size=32, options={"model": name, "backbone": "vgg_tiny", **options})
    return model


def _image():
    return np.random.RandomState(0).randint(0, 256, (37, 45, 3), dtype=np.uint8)


def _no_pickle(folder):
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            head = f.read(2)
        assert not head.startswith(b"\x80") and not head.startswith(b"PK"), name  # pickle protocol / zip (torch.save)


@pytest.mark.parametrize("name,options", [("fcn", {"aux": True}), ("torchvision:lraspp_mobilenet_v3_large", {})])
def test_folder_round_trip_segments_alike(tmp_path, name, options):
    model = _model(name, **options)
    folder = save_pretrained(model, tmp_path / "shared", metrics={"mIoU": 0.5})
    assert sorted(os.listdir(folder)) == ["README.md", "config.json", "model.safetensors"]
    _no_pickle(folder)
    card = open(os.path.join(folder, "README.md"), encoding="utf-8").read()
    assert "thing_6" in card and "mIoU" in card
    loaded = encoding.load_model(str(folder))
    assert loaded.info == model.info
    image = _image()
    labels = encoding.segment(loaded, image)
    assert torch.equal(labels, encoding.segment(model, image))
    assert labels.shape == (37, 45)


def test_shared_folder_refuses_bad_input(tmp_path):
    folder = save_pretrained(_model(), tmp_path / "shared")
    with pytest.raises(ValueError, match="record"):
        encoding.load_model(str(folder), backbone="resnet50")
    config = json.load(open(os.path.join(folder, "config.json")))
    config["info"]["classes"] = config["info"]["classes"][:3]
    config["info"]["palette"] = config["info"]["palette"][:3]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="weights do not fit"):
        encoding.load_model(str(folder))


def test_hub_repository_from_an_offline_cache(tmp_path):
    """A Hub id read through huggingface_hub's cache layout (refs/main -> snapshots/<commit>/...) with
    HF_HUB_OFFLINE=1: no network, the same labels."""
    pytest.importorskip("huggingface_hub")
    model = _model()
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--shapes-fcn"
    save_pretrained(model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    np.save(tmp_path / "image.npy", _image())
    torch.save(encoding.segment(model, _image()), tmp_path / "expected.pt")
    script = ("import sys, numpy, torch, encoding; "
              "m = encoding.load_model('someone/shapes-fcn'); "
              "labels = encoding.segment(m, numpy.load(sys.argv[1])); "
              "assert torch.equal(labels, torch.load(sys.argv[2], weights_only=True)); "
              "print('classes', m.info.classes[-1])")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"), PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "image.npy"), str(tmp_path / "expected.pt")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "classes thing_6" in done.stdout
    shutil.rmtree(repo / "snapshots")
    missing = subprocess.run([sys.executable, "-c", script, "x", "y"], env=env, capture_output=True, text=True,
                             timeout=600)
    assert missing.returncode != 0
    assert "FileNotFoundError: 'someone/shapes-fcn' is no file or folder here" in missing.stderr.strip().splitlines()[-1]


def test_push_to_hub_uploads_the_shared_folder(tmp_path, monkeypatch):
    """push_to_hub through huggingface_hub's HfApi (replaced here by a local stand-in: no network): the repository is
    created (or kept), and what is uploaded is the save_pretrained folder, which loads and segments alike."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from encoding.inference import push_to_hub

    calls, remote = [], tmp_path / "remote"

    class LocalHub:
        def __init__(self, token=None):
            calls.append(("token", token))

        def whoami(self):
            calls.append(("whoami",))
            return {"name": "someone"}

        def create_repo(self, repo_id, private=False, exist_ok=False):
            calls.append(("create_repo", repo_id, private, exist_ok))

        def upload_folder(self, repo_id, folder_path, commit_message):
            calls.append(("upload_folder", repo_id, commit_message))
            shutil.copytree(folder_path, remote)
            return f"https://hub.example/{repo_id}/commit/1"

    monkeypatch.setattr(huggingface_hub, "HfApi", LocalHub)
    model = _model()
    url = push_to_hub(model, "someone/shapes-fcn", private=True, token="secret", metrics={"mIoU": 0.25})
    assert url == "https://hub.example/someone/shapes-fcn/commit/1"
    assert calls == [("token", "secret"), ("whoami",), ("create_repo", "someone/shapes-fcn", True, True),
                     ("upload_folder", "someone/shapes-fcn", "Upload encoding model")]
    assert sorted(os.listdir(remote)) == ["README.md", "config.json", "model.safetensors"]
    _no_pickle(remote)
    assert "0.25" in (remote / "README.md").read_text(encoding="utf-8")
    loaded = encoding.load_model(str(remote))
    assert loaded.info == model.info and torch.equal(encoding.segment(loaded, _image()), encoding.segment(model, _image()))


def test_transformers_model_shares_without_its_source_folder(tmp_path):
    """A transformers:PATH model: config.json carries the Hugging Face config, so the folder it was built from is
    not needed to load the shared model."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation
    torch.manual_seed(0)
    config = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                             patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                             decoder_hidden_size=16, num_labels=7)
    SegformerForSemanticSegmentation(config).save_pretrained(tmp_path / "segformer")
    spec = f"transformers:{tmp_path / 'segformer'}"
    model = get_segmentation_model(spec, dataset="shapes").eval()
    model.info = ModelInfo.of_dataset("shapes", model=spec, backbone="")
    save_pretrained(model, tmp_path / "shared")
    shutil.rmtree(tmp_path / "segformer")
    loaded = encoding.load_model(str(tmp_path / "shared"))
    assert torch.equal(encoding.segment(loaded, _image()), encoding.segment(model, _image()))


def test_binary_network_round_trip(tmp_path):
    torch.manual_seed(0)
    model = get_segmentation_model("fcn", dataset="shapes", backbone="vgg_tiny", nclass=1).eval()
    model.info = ModelInfo("my_masks", ("background", "foreground"), ((0, 0, 0), (255, 255, 255)), binary=True,
                           threshold=0.4, options={"model": "fcn", "backbone": "vgg_tiny"})
    loaded = encoding.load_model(str(save_pretrained(model, tmp_path / "shared")))
    assert loaded.info == model.info and loaded.info.out_channels == 1
    assert torch.equal(encoding.segment(loaded, _image()), encoding.segment(model, _image()))


@pytest.mark.parametrize("offline", ["no network", "not logged in", "HF_HUB_OFFLINE"])
def test_push_to_hub_offline_is_one_line_before_any_work(tmp_path, monkeypatch, offline):
    """Before: a 64-line traceback ending in ConnectError, after the model was saved. Now: one line, before any
    file is written (save_pretrained is never called), whatever huggingface_hub raises."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    import encoding.inference.hub as hub
    from encoding.inference import push_to_hub

    errors = {"no network": OSError("[Errno -3] Temporary failure in name resolution"),
              "not logged in": huggingface_hub.errors.LocalTokenNotFoundError("Token is required (`token=True`), "
                                                                              "but no token found.\nmore text"),
              "HF_HUB_OFFLINE": huggingface_hub.errors.OfflineModeIsEnabled("Cannot reach the Hub: offline mode")}

    class OfflineHub:
        def __init__(self, token=None):
            pass

        def whoami(self):
            raise errors[offline]

        def create_repo(self, *args, **kwargs):  # pragma: no cover - must not be reached
            raise AssertionError("create_repo after a failed login check")

    saved = []
    monkeypatch.setattr(huggingface_hub, "HfApi", OfflineHub)
    monkeypatch.setattr(hub, "save_pretrained", lambda *a, **k: saved.append(a))
    with pytest.raises(hub.HubUnavailable) as caught:
        push_to_hub(_model(), "someone/shapes-fcn")
    message = str(caught.value)
    assert "\n" not in message and "someone/shapes-fcn" in message and "huggingface-cli login" in message
    assert type(errors[offline]).__name__ in message and not saved
    assert caught.value.exit_status == 2
    with pytest.raises(ValueError, match="user/name"):
        push_to_hub(_model(), "no-slash")


def test_load_model_of_an_uncached_repository_offline_is_one_line(tmp_path, monkeypatch):
    """load_model("user/repo") with the Hub unreachable and nothing cached: one FileNotFoundError line."""
    pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    import huggingface_hub.constants as constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(FileNotFoundError) as caught:
        encoding.load_model("someone/not-cached")
    assert "\n" not in str(caught.value) and "someone/not-cached" in str(caught.value)


def _edited(folder, edit):
    path = os.path.join(folder, "config.json")
    config = json.load(open(path))
    edit(config)
    with open(path, "w") as f:
        json.dump(config, f)


MEASURE = ("import resource, sys, encoding\n"
           "try:\n    encoding.load_model(sys.argv[1])\nexcept ValueError as err:\n    print('refused', err)\n"
           "print('maxrss_kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")


def _peak_kib(folder):
    done = subprocess.run([sys.executable, "-c", MEASURE, str(folder)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split("maxrss_kib")[-1]), done.stdout


def test_edited_head_width_is_refused_before_any_allocation(tmp_path):
    """Before: head_channels 10**7 in config.json made load_model allocate 2.88 GB. Now the network is built on the
    meta device and compared with the safetensors header first: refused in one line, the peak memory of the process
    within 150 MiB of loading the intact folder (measured in two fresh processes)."""
    torch.manual_seed(0)
    model = get_segmentation_model("deeplab", dataset="shapes", backbone="vgg_tiny", channels=16).eval()
    model.info = ModelInfo.of_dataset("shapes", model="deeplab", backbone="vgg_tiny", head_channels=16)
    intact = save_pretrained(model, tmp_path / "intact")
    edited = shutil.copytree(intact, tmp_path / "edited")
    _edited(edited, lambda c: c["info"]["options"].update(head_channels=10 ** 7))
    with pytest.raises(ValueError, match="weights do not fit") as caught:
        encoding.load_model(str(edited))
    assert "\n" not in str(caught.value) and str(edited) in str(caught.value)
    base, _ = _peak_kib(intact)
    peak, out = _peak_kib(edited)
    assert "refused" in out and peak - base < 150 * 1024, (base, peak)


def _damage(folder, how):
    weights, config = os.path.join(folder, "model.safetensors"), os.path.join(folder, "config.json")
    if how == "truncated weights":
        data = open(weights, "rb").read()
        open(weights, "wb").write(data[: len(data) // 2])
    elif how == "huge header":
        data = open(weights, "rb").read()
        open(weights, "wb").write((10 ** 12).to_bytes(8, "little") + data[8:])
    elif how == "garbage header":
        data = open(weights, "rb").read()
        open(weights, "wb").write(data[:8] + b"\xff" * 16 + data[24:])
    elif how == "wrong dtype":
        from safetensors.torch import load_file, save_file
        save_file({k: v.half() if v.is_floating_point() else v for k, v in load_file(weights).items()}, weights)
    elif how == "missing info":
        _edited(folder, lambda c: c.pop("info"))
    elif how == "classes of the wrong type":
        _edited(folder, lambda c: c["info"].update(classes=3))
    elif how == "unknown info field":
        _edited(folder, lambda c: c["info"].update(colour="red"))
    elif how == "deeply nested json":
        open(config, "w").write("[" * 200000 + "]" * 200000)
    elif how == "missing weights":
        os.remove(weights)
    elif how == "appended bytes":  # a folder recording no digest: only the header's sizes can tell
        _edited(folder, lambda c: c.pop("weights_sha256"))
        open(weights, "ab").write(b"\0" * 1000)


DAMAGE_SAID = {"truncated weights": "byte range", "huge header": "a header of 1000000000000 bytes",
               "garbage header": "no safetensors header", "wrong dtype": "wrong dtype", "missing info": "no 'info'",
               "classes of the wrong type": "wrong type", "unknown info field": "colour",
               "deeply nested json": "nested too deeply", "missing weights": "model.safetensors",
               "appended bytes": "appended to"}


@pytest.mark.parametrize("how", list(DAMAGE_SAID))
def test_damaged_folder_is_one_line_naming_it(tmp_path, how):
    folder = str(save_pretrained(_model(), tmp_path / "shared"))
    _damage(folder, how)
    with pytest.raises(ValueError) as caught:  # UsageError: never SafetensorError, KeyError, TypeError, RecursionError
        encoding.load_model(folder)
    assert type(caught.value).__name__ == "UsageError" and caught.value.exit_status == 2
    assert "\n" not in str(caught.value) and folder in str(caught.value), str(caught.value)
    assert DAMAGE_SAID[how] in str(caught.value), str(caught.value)
