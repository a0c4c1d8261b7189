"""encoding.export: every registered architecture exported once by torch.export with dynamic shapes (three also with
static ones), run as an ExportedProgram and, converted to ONNX, by onnxruntime; both equal the eager model (fp32, max
abs diff <= 1e-4). The command end to end."""
import json
import re

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from encoding.inference.loading import ModelInfo
from encoding.export import UNEXPORTABLE, ExportError, export_program, metadata, save_program
from encoding.export.cli import cli
from encoding.models import ARCHITECTURES, get_segmentation_model

SIZE = (32, 48)

#: Narrow heads (32 channels, not the default 256 or more): the export traces the same graph (the same
#: operators, the same shapes but the channels) with fewer weights to save, load and run (upernet / fcfpn: 7M
#: parameters at the defaults, 0.3M narrow).
NARROW = {"deeplab": dict(channels=32), "deeplabv3plus": dict(channels=32), "segformer": dict(channels=32),
          "upernet": dict(fpn_dim=32, fuse_channels=32), "fcfpn": dict(fpn_dim=32, fuse_channels=32)}


def tiny_model(name):
    """``name`` on the ``vgg_tiny`` backbone (at output stride 16 where the architecture's default is 32, which
    vgg_tiny has not), its head narrow (:data:`NARROW`); on the architecture's default backbone where vgg_tiny does not
    fit it."""
    stride = None if ARCHITECTURES[name].output_stride in (8, 16) else 16
    torch.manual_seed(0)
    try:
        model = get_segmentation_model(name, dataset="shapes", backbone="vgg_tiny", output_stride=stride,
                                       **NARROW.get(name, {}))
    except ValueError:
        model = get_segmentation_model(name, dataset="shapes")
    model.info = ModelInfo.of_dataset("shapes", model=name)
    return model.eval()


def _onnx_runner(path):
    """The ONNX file at ``path`` as a function of an image (one onnxruntime session)."""
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda image: torch.from_numpy(session.run(None, {"image": image.numpy()})[0])


def _check_both_formats(model, program, tmp_path, dynamic, shapes):
    """``program`` saved as ``.pt2`` and as ONNX, each loaded back and run at every shape of ``shapes``: equal to the
    eager model (fp32, max abs diff <= 1e-4)."""
    meta = metadata(model.info, "onnx", SIZE, dynamic=dynamic)
    save_program(program, str(tmp_path / "m.pt2"), "exported", meta)
    save_program(program, str(tmp_path / "m.onnx"), "onnx", meta)
    loaded, run_onnx = torch.export.load(str(tmp_path / "m.pt2")).module(), _onnx_runner(tmp_path / "m.onnx")
    for shape in shapes:
        image = torch.randn(*shape)
        with torch.no_grad():
            eager = model(image)["out"]
        assert (loaded(image) - eager).abs().max().item() <= 1e-4, shape
        assert (run_onnx(image) - eager).abs().max().item() <= 1e-4, shape


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_exports_dynamic_and_runs_like_eager_at_the_traced_and_other_sizes(name, tmp_path):
    """Every architecture traced once with dynamic shapes (the command's default), both formats run at the traced
    size and at another batch and size (issue 35: PSPNet's and UPerNet's adaptive pooling was fixed to the traced
    size in ONNX); an architecture torch cannot export fails with the documented reason, torch's own."""
    model = tiny_model(name)
    if name in UNEXPORTABLE:
        with pytest.raises(ExportError, match=re.escape(UNEXPORTABLE[name])):
            export_program(model, SIZE, dynamic=True)
        return
    program = export_program(model, SIZE, dynamic=True)
    _check_both_formats(model, program, tmp_path, True, [(1, 3, *SIZE), (2, 3, 72, 104)])


@pytest.mark.parametrize("name", ["fcn", "psp", "segformer"])
def test_a_static_export_runs_like_eager(name, tmp_path):
    """Static shapes on a plain CNN, on adaptive pooling (sizes baked in) and on a transformer: traced once at the
    size, both formats equal eager there."""
    model = tiny_model(name)
    _check_both_formats(model, export_program(model, SIZE), tmp_path, False, [(1, 3, *SIZE)])


def test_export_cli_writes_the_model_and_its_metadata(tiny_run, tmp_path, capsys):
    _, checkpoint, _ = tiny_run
    output = tmp_path / "shapes.onnx"
    assert cli(["--resume", checkpoint, "--format", "onnx", "--output", str(output), "--input-size", "40", "56",
                "--static"]) == 0
    with open(tmp_path / "shapes.json") as f:
        meta = json.load(f)
    assert meta["classes"][:2] == ["background", "disc"] and len(meta["palette"]) == 7
    assert meta["input"]["shape"] == [1, 3, 40, 56] and meta["input"]["dynamic"] is False
    assert meta["output"]["shape"] == [1, 7, 40, 56]  # fixed as the file's output (it said batch / height / width)
    assert meta["model"]["model"] == "unet" and meta["mean"] == pytest.approx([0.485, 0.456, 0.406])
    props = {p.key: json.loads(p.value) for p in onnx.load(str(output)).metadata_props}
    assert props == meta
    from encoding import load_model
    model = load_model(checkpoint)
    image = torch.randn(1, 3, 40, 56)
    with torch.no_grad():
        assert np.abs(_onnx_runner(output)(image).numpy() - model(image)["out"].numpy()).max() <= 1e-4


def test_export_cli_is_dynamic_by_default_with_named_axes(tiny_run, tmp_path, capsys, monkeypatch):
    _, checkpoint, _ = tiny_run
    output = tmp_path / "shapes.onnx"
    assert cli(["--resume", checkpoint, "--format", "onnx", "--output", str(output), "--input-size", "40", "56"]) == 0
    graph = onnx.load(str(output)).graph
    axes = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in (graph.input[0], graph.output[0])]
    assert axes == [["batch", 3, "height", "width"], ["batch", 7, "height", "width"]]
    with open(tmp_path / "shapes.json") as f:
        assert json.load(f)["input"]["dynamic"] is True
    from encoding.export import cli as export_cli

    exports = []  # the old flag: a no-op with a notice (the export itself is the one above)
    monkeypatch.setattr(export_cli, "export_model", lambda model, output, fmt, size, dynamic, **k: exports.append(dynamic) or [output])
    with pytest.warns(FutureWarning, match="--dynamic is the default now"):
        assert cli(["--resume", checkpoint, "--format", "exported", "--output", str(tmp_path / "s.pt2"),
                    "--dynamic"]) == 0
    assert exports == [True]
    assert "note: --dynamic is the default now" in capsys.readouterr().err


def test_export_format_follows_the_output_suffix_else_onnx(tiny_run, tmp_path, monkeypatch, capsys):
    from encoding.export import cli as export_cli

    _, checkpoint, _ = tiny_run
    formats = []
    monkeypatch.setattr(export_cli, "export_model", lambda model, output, fmt, *a, **k: formats.append(fmt) or [output])
    for output in ("m.pt2", "m.PT2", "m.onnx", "m.bin"):
        assert cli(["--resume", checkpoint, "--output", str(tmp_path / output)]) == 0
    assert "note" not in capsys.readouterr().err
    assert cli(["--resume", checkpoint, "--format", "exported", "--output", str(tmp_path / "x.onnx")]) == 0
    assert formats == ["exported", "exported", "onnx", "onnx", "exported"]  # an explicit --format wins
    note = "x.onnx has the suffix of --format onnx and will hold --format exported (name it *.pt2)"
    assert note in capsys.readouterr().err
    assert export_cli.format_of(None) == "onnx"


def test_export_errors_are_one_line(tiny_run, tmp_path, capsys, monkeypatch):
    _, checkpoint, _ = tiny_run
    with pytest.raises(SystemExit) as stop:
        cli(["--resume", checkpoint, "--format", "tflite"])
    assert stop.value.code == 2 and "invalid choice: 'tflite'" in capsys.readouterr().err
    broken = tmp_path / "broken.pth"
    broken.write_bytes(b"not a checkpoint")
    assert cli(["--resume", str(broken), "--format", "onnx"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "broken.pth" in err

    def refuse(*args, **kwargs):
        raise torch._dynamo.exc.Unsupported("data-dependent control flow\nmore detail")

    monkeypatch.setattr(torch.export, "export", refuse)
    assert cli(["--resume", checkpoint, "--format", "exported", "--output", str(tmp_path / "m.pt2")]) == 1
    assert capsys.readouterr().err == ("python -m encoding.export: error: torch.export cannot export unet-vgg_tiny_s2: "
                                       "data-dependent control flow\n")


def test_the_docs_list_the_unexportable_architectures_with_torchs_reason():
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "export.md")
    with open(path, encoding="utf-8") as f:
        section = f.read().split("## Which architectures export", 1)[1]
    assert dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", section, flags=re.M)) == UNEXPORTABLE
    assert ("(none: every registered architecture exports)" in section) == (not UNEXPORTABLE)
