"""Reliability, round 3 (issue 35): the newer features under hostile input, full disks and changing clusters.

Each test failed before its fix: export over its own input / atomic export / dynamic ONNX of the pyramid pooling,
slide inference's uncovered pixels and memory, bounded configuration files, checkpoint options checked against the
stored shapes before building, one-line errors of the memory tool, and the enumeration of the project's file
writers (every one atomic).
"""
import errno
import json
import os

import numpy as np
import pytest
import torch

from encoding.engine.loading import ModelInfo
from encoding.export.cli import cli as export_cli
from encoding.models import get_segmentation_model
from encoding.utils.checkpoint import save_checkpoint


def _network(name="psp", **extra):
    return dict(dataset="shapes", model=name, backbone="vgg_tiny", output_stride=16, crop_size=32, base_size=40,
                **extra)


def _checkpoint(path, name="psp", **extra):
    """A train.py-style checkpoint of a small ``name`` network (random weights) at ``path``."""
    options = _network(name, **extra)
    torch.manual_seed(0)
    model = get_segmentation_model(name, dataset="shapes", backbone="vgg_tiny", output_stride=16,
                                   **({"channels": extra["head_channels"]} if extra.get("head_channels") else {}))
    save_checkpoint({"model": model, "epoch": 0, "args": options}, str(path))
    return str(path)


# ------------------------------------------------------------------------------------------- 1, 2: export files
def test_export_refuses_to_overwrite_its_own_checkpoint(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "model_best.pth", "fcn")
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


def test_export_is_atomic_on_a_full_disk(tmp_path, monkeypatch, capsys):
    ckpt = _checkpoint(tmp_path / "model_best.pth", "fcn")
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


# ------------------------------------------------------------------------------------ 4, 8: slide inference
class _Logits(torch.nn.Module):
    """A stand-in network: 5 classes of logits at its input's size."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 1)

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize("window, stride", [(20, 50), (16, 40), ((16, 16), (8, 40))])
def test_slide_refuses_a_stride_larger_than_the_window(window, stride):
    from encoding import segment
    from encoding.models import SlidingWindow

    image = torch.randint(0, 255, (3, 90, 100), dtype=torch.uint8)
    with pytest.raises(ValueError, match="larger than the window"):
        SlidingWindow(_Logits().eval(), window, stride)
    if isinstance(window, int):
        with pytest.raises(ValueError, match=f"stride {stride} is larger than the window {window}"):
            segment(_Logits().eval(), image, mode="slide", window=window, stride=stride)


@pytest.mark.parametrize("window, stride", [(0, None), (16, 0), (-4, None), (16.5, None)])
def test_slide_refuses_a_zero_or_negative_window(window, stride):
    from encoding import segment

    image = torch.randint(0, 255, (3, 40, 40), dtype=torch.uint8)
    with pytest.raises(ValueError, match="must be a positive number of pixels"):
        segment(_Logits().eval(), image, mode="slide", window=window, stride=stride)


@pytest.mark.parametrize("shape", [(0, 0, 3), (0, 12, 3), (12, 0, 3)])
def test_segment_refuses_an_empty_image_in_one_line(shape):
    from encoding import segment

    with pytest.raises(ValueError, match="empty") as err:
        segment(_Logits().eval(), np.zeros(shape, np.uint8))
    assert "\n" not in str(err.value)


def test_test_py_refuses_stride_past_window_before_any_work(capsys):
    from encoding.engine.inference import EvaluationConfig, build_evaluation
    from encoding.engine.predict import InferenceOptionError

    config = EvaluationConfig(resume="/nonexistent/model_best.pth", inference="slide", window=16, stride=40,
                              mode="testval")
    with pytest.raises(InferenceOptionError, match="stride 40 is larger than the window 16") as err:
        build_evaluation(config)  # before the (missing) checkpoint is even looked at
    assert err.value.exit_status == 2


def test_slide_holds_one_full_size_copy_of_the_logits():
    """The logits are accumulated and averaged in place: one tensor of the result's size is ever allocated."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from encoding.models import MultiEvalModule, SlidingWindow

    class FullSize(TorchDispatchMode):
        def __init__(self, numel):
            super().__init__()
            self.numel, self.allocated = numel, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            inplace = func._schema.name.endswith("_") or any(a.is_out for a in func._schema.arguments)
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor) and not inplace and t.numel() >= self.numel and \
                        func not in (torch.ops.aten.slice.Tensor, torch.ops.aten.view.default,
                                     torch.ops.aten.alias.default, torch.ops.aten.detach.default):
                    self.allocated.append(str(func))
            return out

    image = torch.randn(1, 3, 61, 77)
    model = _Logits().eval()
    whole = model(image)
    for module in (SlidingWindow(model, 24, 16), MultiEvalModule(model, 5, base_size=77, crop_size=24, scales=(1.0,),
                                                                 flip=False)):
        with FullSize(whole.numel()) as mode:
            out = module(image)
        assert len(mode.allocated) == 1, mode.allocated
        torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------- 6, 10: hostile config files
LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))


def _config_error(parser, path):
    from encoding.utils.configfile import ConfigFileError, expand_config

    with pytest.raises(ConfigFileError) as err:
        expand_config(parser, ["--config", str(path)])
    message = str(err.value)
    assert "\n" not in message and len(message) < 600 and str(path) in message
    return message


@pytest.fixture
def train_parser():
    from encoding.utils.cli import OneLineParser

    p = OneLineParser(prog="train.py")
    p.add_argument("--config")
    p.add_argument("--scales", default=None)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--aux", action="store_true")
    return p


@pytest.mark.parametrize("text", [LAUGHS, LAUGHS.replace("i: &i", "scales:"), LAUGHS.replace("i: &i", "aux:"),
                                  LAUGHS.replace("i: &i", "lr:")])
def test_yaml_nested_aliases_are_refused_quickly(text, tmp_path, train_parser):
    import time

    path = tmp_path / "laughs.yaml"
    path.write_text(text)
    started = time.perf_counter()
    assert "expands to more than" in _config_error(train_parser, path)
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("name, content, says", [
    ("binary.yaml", bytes(range(256)) * 4, "not a text file"),
    ("binary.json", b"\xff\xfe\x00{", "not a text file"),
    ("deep.json", b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    ("deep.yaml", b"scales: " + b"[" * 100000 + b"]" * 100000, "nested too deeply"),
    ("deep2.json", b'{"scales": ' + b"[" * 50 + b"]" * 50 + b"}", "nested deeper than"),
    ("huge.yaml", b"lr: 0.1\n" + b"#" * (2 << 20), "larger than"),
    ("long.yaml", b"lr: " + b"x" * 100000, "lr"),
])
def test_hostile_config_files_are_one_line(name, content, says, tmp_path, train_parser):
    path = tmp_path / name
    path.write_bytes(content)
    assert says in _config_error(train_parser, path)


# ------------------------------------------------------------------------------------- 7, 11: the memory tool
@pytest.mark.parametrize("argv, says", [
    (["--model", "nosuchnet"], "unknown segmentation model 'nosuchnet'"),
    (["--backbone", "nosuch"], "unknown backbone 'nosuch'"),
    (["--model", "psp", "--backbone", "mit_b0"], "--model psp --backbone mit_b0"),
    (["--out-dir", "/proc/encoding-test"], "cannot write '/proc/encoding-test/memory_balance.json'"),
    (["--json", "/proc/encoding-test.json"], "--json"),
    (["--json", "same.out", "--chart", "same.out"], "same file"),
])
def test_memory_tool_bad_options_are_one_line_before_any_work(argv, says, tmp_path, capsys, monkeypatch):
    from encoding.memory import cli, report

    monkeypatch.setattr(report, "memory_report", lambda *a, **k: pytest.fail("work started"))
    base = [] if "--out-dir" in argv else ["--out-dir", str(tmp_path)]
    try:
        status = cli.cli(base + argv)  # a bad output: one line at the start of the work
    except SystemExit as stop:  # a bad model: argparse's line while parsing
        status = stop.code
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and says in err


def test_memory_tool_report_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    from encoding.memory import cli

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, f"cannot write {tmp_path}/memory_balance.json: No space left on device")

    monkeypatch.setattr(cli, "memory_report", lambda args: {"strategies": {}, "config": {}})
    monkeypatch.setattr(cli, "format_report", lambda report: "table")
    monkeypatch.setattr(cli, "write_json", full)
    assert cli.cli(["--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left" in err


def test_memory_chart_of_100000_devices_is_drawn_in_bounded_time(tmp_path):
    import time

    from encoding.memory.report import write_chart

    count = 100_000
    peaks = list(np.linspace(100.0, 200.0, count))
    report = {"strategies": {s: {"peak_mib": peaks} for s in ("gather", "balanced")},
              "config": {"model": "fcn", "backbone": "resnet50", "nclass": 21, "batch_size": count,
                         "crop_size": 480, "devices": count, "checkpoint": "none", "amp": None, "calibrate": False,
                         "memory_limit": "11GiB", "memory_limit_mib": 11264.0, "mode": "simulated"}}
    started = time.perf_counter()
    assert write_chart(report, str(tmp_path / "chart.png"))
    assert time.perf_counter() - started < 60
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chart.png"]


# ------------------------------------------------------------------------------ 9, 10: load_model, edited files
def test_load_model_checks_edited_options_against_the_stored_shapes_before_building(tmp_path, monkeypatch):
    from encoding import load_model
    from encoding.engine import loading
    from encoding.utils.checkpoint import CheckpointError

    path = _checkpoint(tmp_path / "model_best.pth", "deeplabv3plus", head_channels=16)
    data = torch.load(path, weights_only=True)
    data["args"]["head_channels"] = 10 ** 7  # the edit: a network of tens of GB
    torch.save(data, path)
    built = []
    real = loading._build
    monkeypatch.setattr(loading, "_build", lambda network, nclass: built.append(str(torch.get_default_device()))
                        or real(network, nclass))
    with pytest.raises(CheckpointError, match="shape mismatch") as err:
        load_model(path)
    assert "\n" not in str(err.value) and "model_best.pth" in str(err.value)
    assert built == ["meta"]  # only the meta twin was built: no memory asked for


@pytest.mark.parametrize("options", [dict(model=3), dict(backbone=["vgg_tiny"]), dict(dataset=None, aux="yes"),
                                     dict(head_channels=-4), dict(crop_size=True), dict(output_stride=8.0)])
def test_load_model_refuses_options_of_the_wrong_type_in_one_line(options, tmp_path):
    from encoding import load_model

    path = _checkpoint(tmp_path / "model_best.pth", "fcn")
    with pytest.raises(ValueError, match="network option") as err:
        load_model(path, **options)
    assert "\n" not in str(err.value)


def test_load_model_refuses_edited_recorded_options_in_one_line(tmp_path):
    from encoding import load_model

    path = _checkpoint(tmp_path / "model_best.pth", "fcn")
    data = torch.load(path, weights_only=True)
    data["args"]["model"] = {"name": "fcn"}
    torch.save(data, path)
    with pytest.raises(ValueError, match="network option 'model' must be a name") as err:
        load_model(path)
    assert "model_best.pth" in str(err.value)
    with pytest.raises(ValueError, match="source must be"):
        load_model(3)


# ----------------------------------------------------------------------------- 3: another world size mid-epoch
def _mid_epoch_checkpoint(path, world_size, iteration=7):
    from encoding.engine.state import training_state

    model = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = training_state(model, optimizer, None, None, epoch=-1, iteration=iteration, best_pred=0.0, best_epoch=-1,
                           args=dict(dataset="shapes", model="unet", backbone="vgg_tiny", batch_size=4,
                                     train_limit=None, optimizer="adamw"), metrics={})
    state["world_size"] = world_size  # the 2-rank run that saved it
    save_checkpoint(state, str(path))
    return str(path)


@pytest.mark.parametrize("saved, now", [(2, 1), (2, 3), (1, 2)])
def test_mid_epoch_checkpoint_resumed_with_another_world_size_is_refused_before_work(saved, now, tmp_path, capsys,
                                                                                     monkeypatch):
    from conftest import TINY, load_script

    from encoding.engine import config as engine_config

    path = _mid_epoch_checkpoint(tmp_path / "checkpoint.pth", saved)
    if now > 1:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(now))
    else:
        monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(engine_config, "build_training", lambda *a, **k: pytest.fail("work started"))
    status = load_script("train").cli(TINY + ["--epochs", "2", "--resume", path, "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert f"with {saved} process(es), this run has {now}" in err


def test_checkpoints_record_the_world_size_and_epoch_ends_resume_anywhere(tmp_path):
    from encoding.engine.state import read, training_state

    model = torch.nn.Linear(2, 2)
    state = training_state(model, torch.optim.SGD(model.parameters(), lr=0.1), None, None, epoch=0, iteration=0,
                           best_pred=0.0, best_epoch=-1, args={}, metrics={})
    assert state["world_size"] == 1
    save_checkpoint(state, str(tmp_path / "c.pth"))
    assert read(str(tmp_path / "c.pth")).world_size_problem(3) is None  # an epoch's end: any world size
    assert read(_mid_epoch_checkpoint(tmp_path / "m.pth", 2)).world_size_problem(2) is None


# ------------------------------------------------------------------------------------- 10, 13: class weights
def test_missing_class_weights_file_is_refused_before_the_dataset_is_generated(tmp_path, capsys, monkeypatch):
    from conftest import TINY, load_script

    from encoding.engine import config as engine_config

    monkeypatch.setattr(engine_config, "build_training", lambda *a, **k: pytest.fail("work started"))
    root = tmp_path / "data"
    train = load_script("train")
    for spec, says in ((tmp_path / "nope.txt", "No such file"), (tmp_path / "three.txt", "holds 3 class weights"),
                       (tmp_path, "not auto/enet/median")):
        if spec.name == "three.txt":
            spec.write_text("1 2 3")
        with pytest.raises(SystemExit) as stop:  # refused while the options are parsed
            train.cli(TINY + ["--class-weights", str(spec), "--data-root", str(root), "--output-dir",
                              str(tmp_path / "runs")])
        status = stop.value.code
        err = capsys.readouterr().err
        assert status == 2 and err.count("\n") == 1 and says in err and f"--class-weights {spec}" in err
    assert not root.exists()  # no dataset generated


@pytest.mark.parametrize("edit", [lambda e: e.update(pixels=e["pixels"][:-1]),
                                  lambda e: e.update(pixels=["x"] * len(e["pixels"])),
                                  lambda e: e.update(pixels=[-5] * len(e["pixels"])),
                                  lambda e: e.update(image_pixels=None),
                                  lambda e: e.update(pixels=[0] * len(e["pixels"]))])
def test_an_edited_label_count_cache_entry_is_counted_again(edit, tmp_path):
    from conftest import tiny_shapes_pair

    from encoding.datasets.class_weights import CACHE_FILE, label_counts
    from encoding.nn import SegmentationLosses

    train, _ = tiny_shapes_pair(str(tmp_path / "data"), num_val=2)
    first = label_counts(train, progress=False)
    cache = os.path.join(train.dataset_dir if hasattr(train, "dataset_dir") else
                         train.dataset.dataset_dir, CACHE_FILE)
    with open(cache) as f:
        entries = json.load(f)
    (key,) = entries
    edit(entries[key])
    with open(cache, "w") as f:
        json.dump(entries, f)
    with pytest.warns(UserWarning, match="edited or corrupt entry"):
        again = label_counts(train, progress=False)
    assert again["cached"] is False and again["pixels"] == first["pixels"]
    from encoding.datasets.class_weights import class_weights
    SegmentationLosses(nclass=len(first["pixels"]), weight=class_weights(again).float())


@pytest.mark.parametrize("value, says", [("inf", "finite"), ("1e15", "at most"), ("nan", "> 0"), ("-inf", "> 0")])
def test_absurd_dist_timeout_is_one_line(value, says, tmp_path, capsys):
    from conftest import TINY, load_script

    with pytest.raises(SystemExit) as stop:
        load_script("train").cli(TINY + [f"--dist-timeout={value}", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "--dist-timeout" in err and says in err
    from encoding.utils.dist import init_distributed_mode
    if value == "1e15":
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
        try:
            with pytest.raises(ValueError, match="timeout_s 1e\\+15: must be"):
                init_distributed_mode(timeout_s=1e15)
        finally:
            for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                os.environ.pop(name)


# ------------------------------------------------------------------------------ every writer of the project
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The calls that put bytes in a file.
_FILE_CALLS = {"os.replace", "os.rename", "torch.save", "onnx.save", "torch.export.save", "np.save", "json.dump",
               "shutil.copy", "shutil.copyfile", "shutil.copy2", "shutil.move"}
_METHODS = {"save", "savefig", "write_text", "write_bytes", "to_csv"}
#: (file, function) -> why its raw write is safe. Everything else must go through encoding.utils.files.atomic_write
#: (or atomic_path / staged_dir) or write into an in-memory buffer first.
ALLOWED = {
    ("encoding/utils/files.py", "atomic_write"): "the atomic helper itself (temporary file, fsync, rename)",
    ("encoding/utils/files.py", "atomic_path"): "the atomic helper for writers that take a file name",
    ("encoding/utils/files.py", "staged_dir"): "the atomic helper for folders (rename of a finished folder)",
    ("encoding/export/core.py", "_write"): "torch.export.save into atomic_path's temporary file",
    ("encoding/export/core.py", "_save_onnx"): "onnx.save into atomic_path's temporary file",
    ("encoding/datasets/prepare/shapes_render.py", "_generate"): "files of a staged_dir folder (renamed when whole)",
    ("encoding/datasets/prepare/download.py", "download"): "a .part file renamed over the target when complete",
    ("encoding/datasets/prepare/download.py", "_fetch_local"): "a .part file renamed over the target when complete",
    ("encoding/datasets/prepare/download.py", "_fetch_http"): "a .part file renamed over the target when complete",
    ("encoding/datasets/prepare/download.py", "_merge_move"): "moves extracted files out of a staged_dir folder",
    ("encoding/utils/logger.py", "write"): "appends one JSONL row per epoch (one write; resume completes the log)",
    ("encoding/utils/logger.py", "_append_csv"): "appends one CSV row per epoch (a new column: atomic_write)",
    ("encoding/memory/cuda.py", "_ddp_worker"): "a rank's result in the measurement's own temporary folder",
}


def _writes(path):
    """``(function, call, target)`` of every call in ``path`` that writes a file."""
    import ast

    found = []

    def visit(node, function, encoded=False):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            inner = encoded
            if isinstance(child, ast.Call):
                call = ast.unparse(child.func)
                args = [ast.unparse(a) for a in child.args]
                inner = encoded or call.endswith("atomic_write")  # bytes made for atomic_write (safetensors.save)
                if encoded:
                    pass
                elif call in ("open", "io.open", "os.fdopen"):
                    modes = child.args[1:2] + [k.value for k in child.keywords if k.arg == "mode"]
                    mode = modes[0].value if modes and isinstance(modes[0], ast.Constant) else "r" if not modes \
                        else "?"
                    if set(mode) & set("wax+?"):
                        found.append((name, call, args[0]))
                elif call in _FILE_CALLS or call.rsplit(".", 1)[-1] in _METHODS and "." in call:
                    target = args[1] if call in ("torch.save", "onnx.save", "torch.export.save", "json.dump") and \
                        len(args) > 1 else (args[0] if args else "")
                    found.append((name, call, target))
            visit(child, name, inner)

    with open(path, encoding="utf-8") as f:
        visit(ast.parse(f.read()), "<module>")
    return found


def test_every_file_writer_of_the_project_is_atomic():
    """A static enumeration of the project's writers: each one writes into a memory buffer (then atomic_write), into
    a staged folder, or is one of the documented ALLOWED exceptions; a new raw write fails here."""
    raw, seen = [], set()
    for folder in ("encoding", "experiments", "scripts"):
        for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(n for n in names if n.endswith(".py")):
                rel = os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/")
                for function, call, target in _writes(os.path.join(dirpath, name)):
                    if (rel, function) in ALLOWED:
                        seen.add((rel, function))
                    elif "buffer" not in target and "staging" not in target:
                        raw.append(f"{rel}:{function}: {call}({target})")
    assert raw == [], "raw file writes (route them through encoding.utils.files.atomic_write):\n" + "\n".join(raw)
    assert seen == set(ALLOWED) - {k for k in ALLOWED if not os.path.exists(os.path.join(ROOT, k[0]))}


def test_atomic_helpers_leave_the_old_file_on_failure_and_refuse_their_input(tmp_path):
    from encoding.utils.files import atomic_path, atomic_write, refuse_own_input

    target = tmp_path / "model.onnx"
    atomic_write(str(target), b"good")
    with pytest.raises(OSError, match="model.onnx"):
        with atomic_path(str(target)) as tmp:
            open(tmp, "wb").write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_bytes() == b"good" and sorted(os.listdir(tmp_path)) == ["model.onnx"]
    link = tmp_path / "link.onnx"
    os.link(target, link)
    for out, inputs, says in ((str(target), [str(target)], "input file"), (str(link), [str(target)], "input file"),
                              (str(tmp_path / "x" / ".." / "model.onnx"), [str(target)], "input file"),
                              ([str(tmp_path / "a"), str(tmp_path / "a")], [], "same file"),
                              (str(tmp_path), [], "directory")):
        with pytest.raises(ValueError, match=says):
            refuse_own_input(out, inputs, "--output")


def test_writers_refuse_their_own_input(tmp_path, capsys):
    from encoding.engine.demo import demo_outputs
    from encoding.utils.plot import main as plot_main

    image = tmp_path / "x_mask.png"
    image.write_bytes(b"an input image")
    other = tmp_path / "x.png"
    other.write_bytes(b"another")
    with pytest.raises(ValueError, match="input file"):
        demo_outputs([str(other), str(image)], str(tmp_path), overwrite=True)
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss\n0,1.0\n1,0.5\n")
    assert plot_main([str(log), "--out", str(log)]) == 1
    assert "input file" in capsys.readouterr().err and log.read_text().startswith("epoch,loss")


def test_predictions_are_never_written_into_the_evaluated_dataset(tmp_path):
    from conftest import tiny_shapes_pair
    from torch.utils.data import Subset

    from encoding.engine.inference import _check_prediction_dir

    _, val = tiny_shapes_pair(str(tmp_path / "data"), num_val=2)
    masks = os.path.join(val.dataset_dir, "SegmentationClass")
    for inside in (val.dataset_dir, masks):
        with pytest.raises(ValueError, match="inside the dataset folder"):
            _check_prediction_dir(inside, Subset(val, [0]))
    _check_prediction_dir(str(tmp_path / "preds"), val)  # elsewhere: fine


def test_dynamic_export_cli_checks_the_file_at_another_size(tmp_path, recwarn):
    ckpt = _checkpoint(tmp_path / "model_best.pth", "psp")
    output = tmp_path / "psp.pt2"
    assert export_cli(["--resume", ckpt, "--format", "exported", "--output", str(output), "--dynamic"]) == 0
    image = torch.randn(2, 3, 72, 104)
    from encoding import load_model
    with torch.no_grad():
        eager = load_model(ckpt)(image)["out"]
    assert (torch.export.load(str(output)).module()(image) - eager).abs().max().item() <= 1e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_best.pth", "psp.json", "psp.pt2"]


@pytest.mark.parametrize("key, value", [("iteration", "7"), ("world_size", 0), ("epoch", 2.5), ("args", [1, 2]),
                                        ("best_epoch", True)])
def test_edited_training_state_counts_are_one_line(key, value, tmp_path):
    from encoding.engine.state import read
    from encoding.utils.checkpoint import CheckpointError

    path = _mid_epoch_checkpoint(tmp_path / "checkpoint.pth", 2)
    data = torch.load(path, weights_only=True)
    data[key] = value
    torch.save(data, path)
    with pytest.raises(CheckpointError, match=key) as err:
        read(path)
    assert "\n" not in str(err.value)
