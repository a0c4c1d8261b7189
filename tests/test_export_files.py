"""The files ``python -m encoding.export`` writes: never over its own input, atomic on a full disk, and a dynamic
export that is wrong at another input size is refused, writing nothing (issue 35).
"""
import errno
import os

import pytest
import torch
from training_runs import network_checkpoint

from encoding.inference.loading import ModelInfo
from encoding.export.cli import cli as export_cli
from encoding.models import get_segmentation_model


def test_export_refuses_to_overwrite_its_own_checkpoint(tmp_path, capsys):
    ckpt = network_checkpoint(tmp_path / "model_best.pth", "fcn")
    before = open(ckpt, "rb").read()
    with pytest.raises(SystemExit) as stop:
        export_cli(["--resume", ckpt, "--format", "exported", "--output", ckpt])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "model_best.pth" in err and "input" in err
    assert open(ckpt, "rb").read() == before
    # --output net.json: the model and its metadata would be one file
    with pytest.raises(SystemExit) as stop:
        export_cli(["--resume", ckpt, "--format", "onnx", "--output", str(tmp_path / "net.json")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "net.json" in err
    assert not (tmp_path / "net.json").exists()


def test_export_refuses_to_overwrite_the_folder_of_its_transformers_network(tmp_path, capsys):
    """A checkpoint of ``transformers:FOLDER`` is rebuilt from FOLDER: ``--output FOLDER/config.onnx`` wrote its
    metadata over FOLDER's config.json (and the checkpoint no longer loaded)."""
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    from encoding.models.external import build_external_model
    from encoding.utils.checkpoint import save_checkpoint

    config = SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
                             patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                             decoder_hidden_size=16, num_labels=7)
    folder = tmp_path / "segformer"
    SegformerForSemanticSegmentation(config).save_pretrained(folder)
    spec = f"transformers:{folder}"
    ckpt = save_checkpoint({"model": build_external_model(spec, 7), "args": {"dataset": "shapes", "model": spec}},
                           str(tmp_path / "run"))
    before = {name: (folder / name).read_bytes() for name in os.listdir(folder)}
    with pytest.raises(SystemExit) as stop:
        export_cli(["--resume", ckpt, "--output", str(folder / "config.onnx")])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]  # not transformers' bars
    assert stop.value.code == 2 and len(errors) == 1 and "config.json: that is the input file" in errors[0]
    assert {name: (folder / name).read_bytes() for name in os.listdir(folder)} == before


def test_export_refuses_to_overwrite_a_file_of_its_input_model_folder(tmp_path, capsys):
    """--resume FOLDER --output FOLDER/config.pt2 wrote its metadata over the folder's config.json (and
    FOLDER/model.safetensors over the weights): every file of the folder is an input."""
    from encoding.inference import save_pretrained

    model = get_segmentation_model("fcn", dataset="shapes", backbone="vgg_tiny").eval()
    model.info = ModelInfo.of_dataset("shapes", model="fcn", backbone="vgg_tiny")
    folder = str(tmp_path / "shared")
    save_pretrained(model, folder)
    before = {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}
    for output in ("config.pt2", "model.safetensors"):
        with pytest.raises(SystemExit) as stop:
            export_cli(["--resume", folder, "--format", "exported", "--static", "--output",
                        os.path.join(folder, output)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and "that is the input file" in err
    assert {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)} == before


def test_export_is_atomic_on_a_full_disk(tmp_path, monkeypatch, capsys):
    ckpt = network_checkpoint(tmp_path / "model_best.pth", "fcn")
    output = tmp_path / "model.pt2"
    assert export_cli(["--resume", ckpt, "--format", "exported", "--output", str(output)]) == 0
    good = output.read_bytes()
    capsys.readouterr()
    real_save = torch.export.save

    def full_disk(program, f, *args, **kwargs):
        with open(f, "wb") as out:
            out.write(b"half a program")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.export, "save", full_disk)
    assert export_cli(["--resume", ckpt, "--format", "exported", "--output", str(output)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left" in err and "model.pt2" in err
    assert output.read_bytes() == good  # the earlier export is intact, and no temporary file is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.pt2", "model_best.pth"]
    monkeypatch.setattr(torch.export, "save", real_save)


def test_a_dynamic_export_wrong_at_another_size_is_not_written(tmp_path, monkeypatch):
    """Without the exportable pooling (the old trace), PSPNet's dynamic ONNX file is wrong at other sizes: the check
    at another size refuses it in one line and writes nothing."""
    from encoding.export import ExportError, core, export_model

    torch.manual_seed(0)
    model = get_segmentation_model("psp", dataset="shapes", backbone="vgg_tiny", output_stride=16).eval()
    model.info = ModelInfo.of_dataset("shapes", model="psp")
    monkeypatch.setattr(core, "exportable_pooling", lambda m: m)
    with pytest.raises(ExportError, match="--static") as err:
        export_model(model, str(tmp_path / "m.onnx"), "onnx", (64, 96), dynamic=True)
    assert "\n" not in str(err.value) and "nothing was written" in str(err.value)
    assert os.listdir(tmp_path) == []


def test_dynamic_export_cli_checks_the_file_at_another_size(tmp_path, recwarn):
    ckpt = network_checkpoint(tmp_path / "model_best.pth", "psp")
    output = tmp_path / "psp.pt2"
    assert export_cli(["--resume", ckpt, "--format", "exported", "--output", str(output), "--dynamic"]) == 0
    image = torch.randn(2, 3, 72, 104)
    from encoding import load_model
    with torch.no_grad():
        eager = load_model(ckpt)(image)["out"]
    assert (torch.export.load(str(output)).module()(image) - eager).abs().max().item() <= 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_best.pth", "psp.json", "psp.pt2"]


def test_export_model_in_python_refuses_the_files_its_model_was_loaded_from(tmp_path):
    """Before: export_model(load_model("run2.pth"), "run2.pth", ...) replaced the checkpoint with the exported program
    (the command line refused it; the Python API's inputs= defaulted to ()). load_model records the files it read."""
    import encoding
    from encoding.errors import UsageError
    from encoding.export import export_model
    from encoding.inference import save_pretrained

    ckpt = network_checkpoint(tmp_path / "run2.pth", "fcn")
    before = open(ckpt, "rb").read()
    model = encoding.load_model(ckpt)
    with pytest.raises(UsageError, match="that is the input file") as err:
        export_model(model, ckpt, "exported", input_size=(32, 32))
    assert "\n" not in str(err.value) and "run2.pth" in str(err.value)
    assert open(ckpt, "rb").read() == before and sorted(os.listdir(tmp_path)) == ["run2.pth"]
    written = export_model(model, str(tmp_path / "run2.pt2"), "exported", input_size=(32, 32), dynamic=False)
    assert str(tmp_path) not in open(written[1]).read()  # the record is the model's, not the metadata's
    assert not any("source" in k for k in model.state_dict())
    # a model folder's files too: neither export_model nor save_pretrained writes over them
    folder = save_pretrained(model, str(tmp_path / "shared"))
    shared = encoding.load_model(folder)
    files = {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)}
    with pytest.raises(UsageError, match="that is the input file"):
        export_model(shared, os.path.join(folder, "config.pt2"), "exported", input_size=(32, 32))
    with pytest.raises(UsageError, match="that is the input file"):
        save_pretrained(shared, folder)
    assert {name: open(os.path.join(folder, name), "rb").read() for name in os.listdir(folder)} == files


def test_export_of_a_hub_id_defaults_to_the_current_folder(tmp_path, monkeypatch, capsys):
    """Before: --resume someone/shapes-fcn without --output wrote ./someone/model.pt2 (the folder beside a checkpoint
    of that name)."""
    import encoding
    import encoding.export.cli as export_cli_module

    model = encoding.load_model(network_checkpoint(tmp_path / "model_best.pth", "fcn"))
    monkeypatch.setattr(export_cli_module, "load_model", lambda source, **kwargs: model)  # the Hub download
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert export_cli(["--resume", "someone/shapes-fcn", "--format", "exported", "--static"]) == 0
    assert sorted(os.listdir(work)) == ["model.json", "model.pt2"]
    assert export_cli_module.default_folder(str(tmp_path / "model_best.pth")) == str(tmp_path)
