"""Audit fixes in ``encoding.utils``: truncated legacy checkpoints, NaN in a smoothed window, ``atomic_path``'s
leftover temporary files, unreadable training logs and generated palettes for more than 256 classes."""
import io
import math
import sys

import numpy as np
import pytest
import torch
from torch import nn

from encoding.utils.checkpoint import CheckpointError, load_checkpoint, read_state_dict
from encoding.utils.files import atomic_path
from encoding.utils.logger import SmoothedValue
from encoding.utils.palette import colorize, generated_palette, palette_of, voc_palette
from encoding.utils.plot import main as plot_main
from encoding.utils.plot import read_log
from encoding.utils.rundir import remove_stale_temp_files


def test_truncated_legacy_checkpoint_is_one_checkpoint_error(tmp_path):
    state = {"format": "encoding.checkpoint", "version": 1, "model": nn.Linear(4, 4).state_dict(), "epoch": 3}
    buffer = io.BytesIO()
    torch.save(state, buffer, _use_new_zipfile_serialization=False)
    blob = buffer.getvalue()
    path = tmp_path / "model.pth.tar"
    for cut in range(1, len(blob)):
        path.write_bytes(blob[:cut])
        for read in (load_checkpoint, read_state_dict):
            with pytest.raises(CheckpointError) as info:
                read(str(path))
            assert str(path) in str(info.value) and "\n" not in str(info.value), (cut, read.__name__)
            # a GLOBAL line cut in the middle ("GLOBAL .", "collections.Ord") is no object to refuse as unsafe
            assert "truncated or corrupt" in str(info.value), (cut, str(info.value))


@pytest.mark.parametrize("dotted, nothing", [(".", True), ("collections.Ord", True), ("torch._utils._rebuild", True),
                                             ("a..b", True), ("collections.OrderedDict", False),
                                             ("argparse.Namespace", False), ("not_imported_module.run", False)])
def test_a_refused_global_names_nothing_only_when_it_cannot_be_an_object(dotted, nothing):
    """Nothing is imported to decide: a module not imported yet may hold a real (unsafe) object."""
    from encoding.utils.torch_files import global_naming_nothing

    message = f"Weights only load failed ... WeightsUnpickler error: Unsupported global: GLOBAL {dotted} was not"
    assert global_naming_nothing(message) == (dotted if nothing else None)
    assert "not_imported_module" not in sys.modules


@pytest.mark.parametrize("window", [[1.0, math.nan, 3.0], [math.nan, 5.0], [2.0, 7.0, math.nan], [math.nan]])
def test_smoothed_value_median_and_max_are_nan_when_the_window_holds_nan(window):
    meter = SmoothedValue(window_size=len(window))
    for value in window:
        meter.update(value)
    assert math.isnan(meter.median) and math.isnan(meter.max)
    meter.update(4.0)  # the NaN may still be in the window
    if any(math.isnan(v) for v in meter.deque):
        assert math.isnan(meter.median) and math.isnan(meter.max)
    clean = SmoothedValue(window_size=3)
    for value in (3.0, 1.0, 2.0):
        clean.update(value)
    assert clean.median == 2.0 and clean.max == 3.0


def test_remove_stale_temp_files_removes_atomic_path_leftovers(tmp_path):
    leftover = tmp_path / f".model.{'ab' * 16}.tmp.pt2"
    leftover.write_bytes(b"partial")
    plain = tmp_path / f".checkpoint.pth.{'cd' * 16}.tmp"
    plain.write_bytes(b"partial")
    users = [tmp_path / "model.pt2", tmp_path / "notes.tmp.txt", tmp_path / f"model.{'ab' * 16}.tmp.pt2",
             tmp_path / f".model.{'ab' * 15}.tmp.pt2"]
    for user in users:
        user.write_bytes(b"mine")
    with pytest.raises(RuntimeError):
        with atomic_path(str(tmp_path / "other.pt2")) as tmp:  # the name atomic_path really uses
            open(tmp, "wb").close()
            real = tmp
            raise RuntimeError("interrupted")
    open(real, "wb").close()  # as if the process had died instead
    removed = remove_stale_temp_files(str(tmp_path))
    assert sorted(removed) == sorted([str(leftover), str(plain), real])
    assert all(user.exists() for user in users)


def test_plot_log_not_utf8_names_the_file(tmp_path, capsys):
    path = tmp_path / "log.csv"
    path.write_bytes(b"epoch,loss\n1,\xff\xfe\n")
    with pytest.raises(ValueError, match="log.csv") as info:
        read_log(str(path))
    assert not isinstance(info.value, UnicodeDecodeError)
    assert plot_main([str(path)]) == 1
    assert str(path) in capsys.readouterr().err


def test_plot_log_cell_over_the_csv_field_limit_names_the_file(tmp_path, capsys):
    path = tmp_path / "log.csv"
    path.write_text('epoch,loss\n1,"' + "x" * 200000 + '"\n')
    with pytest.raises(ValueError, match="log.csv"):
        read_log(str(path))
    assert plot_main([str(path)]) == 1
    assert str(path) in capsys.readouterr().err


def test_generated_palette_beyond_256_classes():
    assert generated_palette(256) == voc_palette(256) and generated_palette(21) == voc_palette(21)
    palette = generated_palette(300)
    assert len(palette) == 300 and len(set(palette)) == 300 and palette[:256] == voc_palette(256)
    assert all(len(c) == 3 and all(0 <= v <= 255 for v in c) for c in palette)
    big = generated_palette(5000)
    assert len(set(big)) == 5000 and big[:300] == palette

    class Big:
        NUM_CLASS = 300
        CLASSES = tuple(f"c{i}" for i in range(300))
        PALETTE = None

    assert palette_of(Big) == palette
    with pytest.raises(ValueError) as info:
        colorize(np.zeros((2, 2), dtype=np.int64), palette)
    message = str(info.value)
    assert "\n" not in message and "300" in message and "254" in message


def test_the_curves_command_prints_no_runpy_warning():
    """``python -m encoding.utils.plot`` printed runpy's "found in sys.modules" warning on every run: the package
    imported the command's module (the curves are drawn by ``encoding.utils.curves``, which the package imports)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "default", "-m", "encoding.utils.plot", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "LOG_CSV" in done.stdout
    assert "found in sys.modules" not in done.stderr, done.stderr
