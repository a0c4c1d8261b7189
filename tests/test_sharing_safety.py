"""Sharing and export safety (the audit of save_pretrained / load_model / export): one threshold for a binary
network's labels everywhere, a shared folder's fields checked, save_pretrained never over the folder a network is
read from nor writing what its loader refuses, `module.` weights, exports without dead heads, one-line refusals."""
import json
import os
import sys

import numpy as np
import pytest
import torch

import encoding
from encoding.errors import MissingDependency, UsageError
from encoding.export import export_model, export_program
from encoding.export.cli import cli
from encoding.inference import ModelInfo, save_pretrained
from encoding.inference.hub import load_pretrained
from encoding.inference.predict import to_batch
from encoding.models import get_segmentation_model
from encoding.utils.checkpoint import save_checkpoint

pytest.importorskip("safetensors")


def _model(name="fcn", **options):
    torch.manual_seed(0)
    model = get_segmentation_model(name, dataset="shapes", backbone="vgg_tiny", **options).eval()
    model.info = ModelInfo.of_dataset("shapes", model=name, backbone="vgg_tiny", crop_size=32, base_size=40,
                                      **options)
    return model


def _image():
    return np.random.RandomState(0).randint(0, 256, (32, 48, 3), dtype=np.uint8)


def _binary(threshold):
    """A binary network whose foreground probability is sigmoid(0.85) = 0.70 everywhere."""
    torch.manual_seed(0)
    net = get_segmentation_model("fcn", dataset="shapes", backbone="vgg_tiny", nclass=1).eval()
    last = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(0.85)
    net.info = ModelInfo("masks", ("background", "foreground"), ((0, 0, 0), (255, 255, 255)), binary=True,
                         threshold=threshold, crop_size=32, options={"model": "fcn", "backbone": "vgg_tiny"})
    return net


def _one_line(err):
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# 1. one threshold ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("threshold,foreground", [(0.9, 0.0), (0.6, 1.0)])
def test_segment_and_the_export_metadata_use_the_one_threshold_of_the_model_info(tmp_path, threshold, foreground):
    """Before: segment thresholded at info.options.get("threshold", 0.5) (0.5 here: all foreground) while the
    export's metadata said sigmoid > info.threshold (0.9: all background)."""
    net = _binary(threshold)
    labels = encoding.segment(net, _image())
    assert labels.float().mean().item() == foreground
    written = export_model(net, str(tmp_path / "m.pt2"), "exported", (32, 48), dynamic=False)
    meta = json.load(open(written[1]))
    assert meta["output"]["labels"] == f"sigmoid > {threshold} (one foreground channel)"
    with torch.no_grad():
        logits = torch.export.load(written[0]).module()(to_batch(_image()))
    assert torch.equal((torch.sigmoid(logits[:, 0]) > threshold).long()[0], labels)


def _edited(tmp_path, **fields):
    folder = save_pretrained(_binary(0.3), tmp_path / "shared")
    path = os.path.join(folder, "config.json")
    data = json.load(open(path))
    data["info"].update(fields)
    with open(path, "w") as f:
        json.dump(data, f)
    return str(folder)


@pytest.mark.parametrize("field,value", [("threshold", "0.3"), ("threshold", float("nan")), ("threshold", 7),
                                         ("threshold", 0), ("binary", "false"), ("std", [0, 0, 0]),
                                         ("std", [float("nan")] * 3), ("mean", [float("inf"), 0, 0]),
                                         ("ignore_index", "x"), ("ignore_index", True)])
def test_a_shared_folder_with_a_bad_label_field_is_refused_in_one_line(tmp_path, field, value):
    """Before: each loaded; segment then thresholded a string, divided by a std of 0, or read "false" as true."""
    folder = _edited(tmp_path, **{field: value})
    with pytest.raises(UsageError) as err:
        encoding.load_model(folder)
    message = _one_line(err)
    assert folder in message and field in message


def test_a_shared_folder_with_good_label_fields_loads(tmp_path):
    folder = _edited(tmp_path, threshold=0.25, ignore_index=255, std=[0.2, 0.3, 0.4])
    info = encoding.load_model(folder).info
    assert (info.threshold, info.ignore_index, info.std, info.binary) == (0.25, 255, (0.2, 0.3, 0.4), True)


def _without_digest(folder):
    """The folder as one saved before config.json recorded its weights' SHA-256 (or a hand-made one)."""
    path = os.path.join(folder, "config.json")
    data = json.load(open(path))
    del data["weights_sha256"]
    with open(path, "w") as f:
        json.dump(data, f)


def test_a_folder_whose_weights_are_not_the_ones_its_config_was_saved_with_is_refused(tmp_path, monkeypatch):
    """save_pretrained writes its files one by one: interrupted between the weights and config.json, the folder
    held the new weights under the old config (the old classes and options). config.json records the weights'
    SHA-256 now, and a folder whose weights differ is refused, naming it."""
    import encoding.inference.hub as hub

    folder = str(save_pretrained(_model(), tmp_path / "shared"))
    before = encoding.load_model(folder).state_dict()
    real = hub.atomic_write

    def dies_before_the_config(path, data):
        if path.endswith("config.json"):
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(hub, "atomic_write", dies_before_the_config)
    other = _model()
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        save_pretrained(other, folder)
    monkeypatch.undo()
    with pytest.raises(UsageError, match="weights_sha256") as err:
        encoding.load_model(folder)
    assert folder in _one_line(err)
    _without_digest(folder)  # a folder saved before the digest was recorded is read as it is
    loaded = encoding.load_model(folder).state_dict()
    assert not all(torch.equal(loaded[k], before[k]) for k in before)


# 2. save_pretrained's target ---------------------------------------------------------------------------------------

def test_save_pretrained_refuses_the_folder_a_transformers_network_is_built_from(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                                          patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
                                          mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=7)
    source = tmp_path / "segformer"
    transformers.SegformerForSemanticSegmentation(config).save_pretrained(source)
    spec = f"transformers:{source}"
    model = get_segmentation_model(spec, dataset="shapes").eval()
    model.info = ModelInfo.of_dataset("shapes", model=spec, backbone="")
    before = {name: (source / name).read_bytes() for name in os.listdir(source)}
    with pytest.raises(UsageError) as err:
        save_pretrained(model, source)
    assert str(source) in _one_line(err) and "input file" in str(err.value)
    assert {name: (source / name).read_bytes() for name in os.listdir(source)} == before
    assert sorted(os.listdir(save_pretrained(model, tmp_path / "elsewhere"))) == [
        "README.md", "config.json", "model.safetensors"]


def test_save_pretrained_into_a_file_is_one_line(tmp_path):
    target = tmp_path / "taken"
    target.write_text("mine")
    with pytest.raises(UsageError) as err:
        save_pretrained(_model(), target)
    assert str(target) in _one_line(err) and "is a file" in str(err.value)
    assert target.read_text() == "mine"


# 3. weights with a module. prefix ------------------------------------------------------------------------------

def test_a_shared_folder_of_module_prefixed_weights_loads_them(tmp_path):
    """Before: check_state_fits (which drops the prefix) passed, then the dtype check raised KeyError."""
    from safetensors.torch import load_file, save_file

    model = _model()
    folder = save_pretrained(model, tmp_path / "shared")
    _without_digest(folder)  # a hand-made folder: its weights are edited below
    weights = os.path.join(folder, "model.safetensors")
    save_file({"module." + k: v for k, v in load_file(weights).items()}, weights, metadata={"format": "pt"})
    loaded = encoding.load_model(str(folder))
    assert torch.equal(encoding.segment(loaded, _image()), encoding.segment(model, _image()))
    state = load_file(weights)
    state["module.backbone.conv1.0.weight"] = state["module.backbone.conv1.0.weight"].double()
    save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(UsageError) as err:  # the dtype check reads the prefixed keys too
        encoding.load_model(str(folder))
    assert "wrong dtype" in _one_line(err) and "backbone.conv1.0.weight" in str(err.value)


# 4. what save_pretrained writes, its loader reads ------------------------------------------------------------------

@pytest.mark.parametrize("wrap", ["compile", "data_parallel"])
def test_save_pretrained_of_a_wrapped_model_writes_the_networks_own_keys(tmp_path, wrap):
    model = _model()
    wrapped = torch.compile(model) if wrap == "compile" else torch.nn.DataParallel(model)
    folder = save_pretrained(wrapped, tmp_path / "shared")
    loaded = encoding.load_model(str(folder))
    assert loaded.info == model.info
    image = torch.randn(1, 3, 32, 40)
    with torch.no_grad():
        assert torch.equal(loaded(image)["out"], model(image)["out"])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_save_pretrained_refuses_weights_its_loader_would_refuse(tmp_path, dtype):
    with pytest.raises(UsageError) as err:
        save_pretrained(_model().to(dtype), tmp_path / "shared")
    assert str(dtype) in _one_line(err) and "model.float()" in str(err.value)
    assert not (tmp_path / "shared").exists()


@pytest.mark.parametrize("info, said", [
    (ModelInfo.of_dataset("shapes", crop_size=32), "config.json names no model"),
    (ModelInfo.of_dataset("shapes", model="unet", backbone="vgg_tiny"), "the weights do not fit unet"),
    (ModelInfo.of_dataset("shapes", model="fcn", backbone="vgg_tiny", aux=True), "the weights do not fit fcn"),
])
def test_save_pretrained_refuses_an_info_its_loader_would_refuse(tmp_path, info, said):
    """Before: the folder was written, and encoding.load_model refused it (no model named; another architecture or
    aux than the network's weights). Now the loader's own checks refuse it before anything is written."""
    model = _model()
    model.info = info
    with pytest.raises(UsageError) as err:
        save_pretrained(model, tmp_path / "shared")
    assert said in _one_line(err) and "save_pretrained" in str(err.value)
    assert not (tmp_path / "shared").exists()


# 5. exports hold the main output only ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,options", [("fcn", {"aux": True}), ("encnet", {"aux": True, "se_loss": True})])
@pytest.mark.parametrize("dynamic", [False, True])
def test_the_exported_program_drops_the_aux_and_se_heads(name, options, dynamic):
    model = _model(name, **options)
    program = export_program(model, (32, 48), dynamic)
    heads = [k for k in program.state_dict if "aux" in k or "selayer" in k]
    assert heads == [] and any("classifier" in k for k in program.state_dict)
    dead = [n for n in program.graph.nodes if n.op == "call_function" and not n.users
            and "assert" not in str(n.target)]  # torch's shape checks stay
    assert dead == []
    image = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        assert torch.allclose(program.module()(image), model(image)["out"], atol=1e-5)


# 6-8. export_model's input size and format, before any trace -----------------------------------------------------

@pytest.fixture
def untraceable(monkeypatch):
    def refuse(*args, **kwargs):  # pragma: no cover - must not be reached
        raise AssertionError("traced before the refusal")

    monkeypatch.setattr(torch.export, "export", refuse)


def test_no_crop_size_and_no_input_size_asks_for_input_size(tmp_path, capsys, untraceable):
    """Before: a TypeError, 'unexpected error (a bug)'. A dataset of one's own records classes, no crop size."""
    net = get_segmentation_model("fcn", dataset="shapes", backbone="vgg_tiny", nclass=3)
    checkpoint = tmp_path / "nocrop.pth"
    save_checkpoint({"model": net, "epoch": 0, "args": {"dataset": "mydata", "model": "fcn", "backbone": "vgg_tiny",
                                                        "classes": ["a", "b", "c"], "palette": [[0, 0, 0]] * 3}},
                    str(checkpoint))
    assert cli(["--resume", str(checkpoint), "--output", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--input-size H W" in err and "bug" not in err
    assert not (tmp_path / "m.onnx").exists()


def test_an_input_size_over_the_pixel_limit_is_refused_before_tracing(tmp_path, untraceable):
    with pytest.raises(UsageError) as err:
        export_model(_model(), str(tmp_path / "m.pt2"), "exported", (200000, 200000))
    assert "200000" in _one_line(err) and "limit" in str(err.value)


def test_onnx_without_the_onnx_package_names_the_extra_before_tracing(tmp_path, monkeypatch, untraceable):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx raises ImportError
    with pytest.raises(MissingDependency) as err:
        export_model(_model(), str(tmp_path / "m.onnx"), "onnx", (32, 32))
    assert "encoding[export]" in _one_line(err) and "onnx" in str(err.value)
    assert not (tmp_path / "m.onnx").exists()


def test_onnx_without_onnxruntime_is_refused_before_tracing_not_left_unchecked(tmp_path, monkeypatch, untraceable):
    """Before: without onnxruntime a dynamic ONNX export was written without its check at another size (the check
    compared nothing). onnxruntime is part of the export extra: its absence is one line naming it, nothing traced."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingDependency) as err:
        export_model(_model(), str(tmp_path / "m.onnx"), "onnx", (32, 48), dynamic=True)
    assert "onnxruntime" in _one_line(err) and "encoding[export]" in str(err.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("size", [(0, 32), (-4, 32), (32.5, 32), (32,), (True, 32), "32"])
def test_an_input_size_that_is_not_two_positive_ints_is_refused_before_tracing(tmp_path, size, untraceable):
    """Before: torch's errors (negative dimension, randn's TypeError, a kernel larger than the input)."""
    with pytest.raises(UsageError) as err:
        export_model(_model(), str(tmp_path / "m.pt2"), "exported", size)
    assert _one_line(err).startswith(f"input_size {size!r}") and "--input-size" in str(err.value)
    assert os.listdir(tmp_path) == []


# 9. the caller's model keeps its mode ------------------------------------------------------------------------------

def test_export_leaves_the_callers_model_in_the_mode_it_was_in(tmp_path):
    model = _model().train()
    model.backbone.eval()  # a frozen part stays frozen
    export_program(model, (32, 32))
    assert model.training and model.classifier.training and not model.backbone.training
    export_model(model, str(tmp_path / "m.pt2"), "exported", (32, 32), dynamic=True)
    assert model.training and not model.backbone.training
    model.eval()
    export_program(model, (32, 32))
    assert not any(m.training for m in model.modules())


# 10. minor one-line refusals -----------------------------------------------------------------------------------

def test_a_revision_of_a_local_folder_is_refused(tmp_path):
    folder = save_pretrained(_model(), tmp_path / "shared")
    with pytest.raises(UsageError) as err:
        load_pretrained(folder, revision="v1")
    assert folder in _one_line(err) and "revision" in str(err.value)


def test_a_folder_without_config_json_is_not_a_shared_model(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError) as err:
        encoding.load_model(str(tmp_path / "empty"))
    message = _one_line(err)
    assert "config.json" in message and "IsADirectoryError" not in message and "corrupt" not in message


def test_static_and_dynamic_together_are_refused(tmp_path, capsys):
    checkpoint = tmp_path / "m.pth"
    save_checkpoint({"model": _model(), "epoch": 0, "args": {"dataset": "shapes", "model": "fcn",
                                                             "backbone": "vgg_tiny", "crop_size": 32}}, str(checkpoint))
    with pytest.raises(SystemExit) as stop:
        cli(["--resume", str(checkpoint), "--static", "--dynamic"])
    assert stop.value.code == 2 and "--static and --dynamic" in capsys.readouterr().err
