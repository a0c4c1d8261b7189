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
from encoding.engine import ModelInfo, save_pretrained
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
    from encoding.engine import push_to_hub

    calls, remote = [], tmp_path / "remote"

    class LocalHub:
        def __init__(self, token=None):
            calls.append(("token", token))

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
    assert calls == [("token", "secret"), ("create_repo", "someone/shapes-fcn", True, True),
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
