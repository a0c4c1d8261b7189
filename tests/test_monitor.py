"""Issue 27 item 2: watching a run. ``--tensorboard`` event files and the offline ``--wandb`` run hold the numbers of
the CSV log (read back with their own readers), with validation previews; the curves PNG at the end of training and
``python -m encoding.utils.plot``.
"""
import csv
import glob
import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from wandb.proto import wandb_internal_pb2

from conftest import TINY, load_script, tiny_shapes_pair
from encoding.engine.previews import validation_previews
from encoding.models import get_segmentation_model
from encoding.utils import plot
from encoding.utils.plot import CURVES_NAME

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def watched_run(shapes_root, tmp_path_factory):
    """Two tiny epochs with --tensorboard --wandb, previews every epoch: the run directory."""
    out = tmp_path_factory.mktemp("watched")
    load_script("train").main(TINY[:-2] + ["--epochs", "2", "--output-dir", str(out), "--tensorboard", "--wandb",
                                           "--log-images", "1"], datasets=tiny_shapes_pair(shapes_root))
    return out / "shapes" / "unet" / "default"


def _csv_rows(run_dir):
    with open(run_dir / "log.csv", newline="") as f:
        return list(csv.DictReader(f))


def _csv_scalars(run_dir):
    """``{(tag, epoch): value}`` of every number of the CSV log (empty cells: an undefined class IoU)."""
    return {(key, int(row["epoch"])): float(value) for row in _csv_rows(run_dir)
            for key, value in row.items() if key != "epoch" and value != ""}


def test_tensorboard_scalars_equal_the_csv_rows(watched_run):
    events = EventAccumulator(str(watched_run), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    logged = {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    expected = _csv_scalars(watched_run)
    assert {"loss", "lr", "pixAcc", "mIoU", "IoU/background"} <= {tag for tag, _ in expected}
    assert logged.keys() == expected.keys()
    for key, value in expected.items():
        assert logged[key] == pytest.approx(value, rel=1e-6), key  # event files hold float32
    images = {tag: [e.step for e in events.Images(tag)] for tag in events.Tags()["images"]}
    assert images and all(steps == [0, 1] for steps in images.values()), images


def _wandb_records(path):
    """The records of a W&B transaction log (``run-*.wandb``): LevelDB's log format (32 KiB blocks of chunks with
    a 7-byte header: checksum, length, type) after W&B's own 7-byte file header."""
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # the tail of a block is padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_run_logged_the_csv_rows(watched_run):
    runs = glob.glob(str(watched_run / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(runs) == 1
    history = {}
    for record in _wandb_records(runs[0]):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(items["_step"], {}).update(items)
    logged = {(key, step): value for step, items in history.items() for key, value in items.items()
              if not key.startswith(("_", "val/"))}  # val/<i>/...: the preview images' fields
    assert logged == pytest.approx(_csv_scalars(watched_run), rel=1e-12)
    assert all(history[step]["val/0/_type"] == "image-file" for step in (0, 1))


def test_curves_png_at_the_end_and_from_the_command_line(watched_run, tmp_path, capsys):
    assert (watched_run / CURVES_NAME).read_bytes().startswith(PNG)
    out = tmp_path / "curves.png"
    assert plot.main([str(watched_run / "log.csv"), "--out", str(out)]) == 0  # python -m encoding.utils.plot
    assert capsys.readouterr().out.strip() == str(out) and out.read_bytes().startswith(PNG)


@pytest.mark.parametrize("text,message", [
    (None, "no such log file"),
    ("epoch,loss\n", "not a training log"),
    ("epoch,loss\n0,abc\n", "line 2, column 'loss': not a number: 'abc'"),
])
def test_plot_of_a_missing_or_garbled_log_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "log.csv"
    if text is not None:
        path.write_text(text)
    assert plot.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"python -m encoding.utils.plot: error: {path}: {message}") and err.count("\n") == 1


def test_previews_show_image_mask_and_prediction(tiny_shapes):
    model = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny")
    previews = validation_previews(model, tiny_shapes[1], "shapes", count=2)
    assert list(previews) == ["val/0", "val/1"]
    height, width = tiny_shapes[1][0][1].shape
    assert previews["val/0"].shape == (height, 3 * width, 3) and previews["val/0"].dtype == np.uint8
    assert model.training  # left as it was


@pytest.mark.parametrize("option,install", [("--tensorboard", "pip install -e .[monitor]"),
                                            ("--wandb", "pip install wandb")])
def test_a_missing_monitor_library_is_one_line(monkeypatch, capsys, option, install):
    import importlib.util

    real = importlib.util.find_spec
    name = option[2:]
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == name else real(n, *a))
    with pytest.raises(SystemExit) as stop:
        load_script("train").cli([option, "--epochs", "1"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err == f"train.py: error: {option} needs the {name} package, which is not installed: {install} (see --help)\n"
