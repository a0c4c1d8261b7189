"""experiments/segmentation/test.py and demo.py, end to end on a tiny generated `shapes` split (CPU)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import SCRIPTS, load_script, tiny_eval_set
from encoding.datasets.shapes import SHAPES_CLASSES, SHAPES_PALETTE
from encoding.engine.inference import read_image, segment
from encoding.engine.state import read
from encoding.models import get_segmentation_model
from encoding.utils import load_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 5 validation images (conftest's tiny_run): two processes get 3 + 2

# Runs test.py on the tiny validation set (what run_test does in-process), e.g. under torchrun.
LAUNCHER = """
import sys
sys.path[:0] = [{tests!r}, {scripts!r}]
from conftest import tiny_eval_set
import test
sys.exit(test.cli(sys.argv[1:], data=tiny_eval_set()))
"""


@pytest.fixture(scope="module")
def trained(tiny_run):
    """One epoch of train.py on the tiny split: (data root, checkpoint path, the run's last validation result)."""
    return tiny_run


def run_test(*argv, root, mode="val"):
    return load_script("test").main(["--workers", "0", *argv], data=tiny_eval_set(root, mode))


def read_metrics(folder):
    with open(os.path.join(folder, "metrics.json")) as f:
        return json.load(f)


def val_images(base):
    return tiny_eval_set(base, "test").images


def test_test_py_reproduces_the_last_validation(trained, tmp_path):
    base, checkpoint, result = trained
    scores = run_test("--resume", checkpoint, "--out-dir", str(tmp_path), root=base)
    saved = read_metrics(tmp_path)
    for key in ("pixAcc", "mIoU"):
        assert scores[key] == result[key]
        assert saved[key] == pytest.approx(result[key], abs=1e-12)
    assert saved["split"] == "val" and saved["mode"] == "val" and saved["weights"] == checkpoint
    assert list(saved["per_class"]) == list(SHAPES_CLASSES)
    # the network options came from the checkpoint: nothing but --resume was needed
    assert load_checkpoint(checkpoint)["args"]["model"] == "unet"


def test_two_cpu_devices_score_like_one(trained, tmp_path):
    base, checkpoint, _ = trained
    one = run_test("--resume", checkpoint, "--out-dir", str(tmp_path / "one"), root=base)
    two = run_test("--resume", checkpoint, "--out-dir", str(tmp_path / "two"), "--device-ids", "cpu,cpu",
                   "--test-batch-size", "3", root=base)
    torch.testing.assert_close(two["confusion"], one["confusion"], rtol=0, atol=0)
    ms_one = run_test("--resume", checkpoint, "--multi-scale", "--scales", "0.75,1.25", "--out-dir",
                      str(tmp_path / "ms1"), root=base, mode="testval")
    ms_two = run_test("--resume", checkpoint, "--multi-scale", "--scales", "0.75,1.25", "--out-dir",
                      str(tmp_path / "ms2"), "--device-ids", "cpu,cpu", root=base, mode="testval")
    torch.testing.assert_close(ms_two["confusion"], ms_one["confusion"], rtol=0, atol=0)
    saved = read_metrics(tmp_path / "ms2")
    assert saved["mode"] == "testval" and saved["scales"] == [0.75, 1.25] and saved["flip"] is True
    assert 0 <= saved["mIoU"] <= 1


def test_saved_predictions_map_back_to_the_predicted_classes(trained, tmp_path):
    """--mode test (what the mask-less test split uses) writes one PNG per input, named after it, whose colours
    are the dataset palette's colours of the classes the model predicts on the whole image."""
    base, checkpoint, _ = trained
    assert run_test("--resume", checkpoint, "--mode", "test", "--save-pred", str(tmp_path), root=base,
                    mode="test") == {}
    images = val_images(base)
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.splitext(os.path.basename(p))[0] + ".png" for p in images)
    args = load_checkpoint(checkpoint)["args"]
    width = {"channels": args["head_channels"]} if args["head_channels"] else {}
    model = get_segmentation_model(args["model"], dataset="shapes", backbone=args["backbone"],
                                   output_stride=args["output_stride"], **width)
    read(checkpoint).restore_weights(model)
    colours = {colour: cls for cls, colour in enumerate(SHAPES_PALETTE)}
    for path in images:
        expected = segment(model.eval(), read_image(path)).numpy()
        rgb = np.asarray(Image.open(tmp_path / (os.path.splitext(os.path.basename(path))[0] + ".png")).convert("RGB"))
        decoded = np.vectorize(lambda r, g, b: colours[(r, g, b)])(rgb[..., 0], rgb[..., 1], rgb[..., 2])
        np.testing.assert_array_equal(decoded, expected)


def test_torchrun_two_processes_score_like_one(trained, tmp_path):
    base, checkpoint, _ = trained
    one = run_test("--resume", checkpoint, "--out-dir", str(tmp_path / "one"), root=base)
    launcher = tmp_path / "launch_test.py"
    launcher.write_text(LAUNCHER.format(tests=os.path.join(ROOT, "tests"), scripts=SCRIPTS))
    env = {**os.environ, "ENCODING_DATA": str(base / "data"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(launcher), "--resume", checkpoint, "--workers", "0", "--out-dir",
                           str(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    two = read_metrics(tmp_path / "two")
    assert two["pixAcc"] == pytest.approx(one["pixAcc"], abs=1e-12)
    assert two["mIoU"] == pytest.approx(one["mIoU"], abs=1e-12)


def test_test_py_needs_exactly_one_source_of_weights(trained, capsys):
    _, checkpoint, _ = trained
    test = load_script("test")
    for argv, message in [([], "pass exactly one of --resume"),
                          (["--resume", checkpoint, "--model-zoo", "fcn_resnet50_voc"], "got --resume, --model-zoo"),
                          (["--model-zoo", "fcn_resnet9_voc"], "unknown name 'fcn_resnet9_voc'"),
                          (["--resume", "missing.pth"], "no such file: missing.pth"),
                          (["--resume", checkpoint, "--multi-scale", "--mode", "val"], "--mode testval")]:
        with pytest.raises(SystemExit) as stop:
            test.main(argv)
        assert stop.value.code == 2
        assert message in capsys.readouterr().err


def test_demo_writes_mask_and_overlay_for_any_image(trained, tmp_path):
    base, checkpoint, _ = trained
    source = Image.open(val_images(base)[0])
    grey, rgba = tmp_path / "grey.png", tmp_path / "photo.jpg"
    source.convert("L").resize((50, 37)).save(grey)
    source.convert("RGBA").save(tmp_path / "rgba.png")
    source.save(rgba)
    written = load_script("demo").main([str(grey), str(tmp_path / "rgba.png"), str(rgba), "--resume", checkpoint,
                                        "--out-dir", str(tmp_path / "out")])
    assert [os.path.basename(m) for m, _ in written] == ["grey_mask.png", "rgba_mask.png", "photo_mask.png"]
    mask, overlay = (Image.open(p) for p in written[0])
    assert mask.mode == "P" and mask.size == (50, 37)
    assert int(np.asarray(mask).max()) < len(SHAPES_PALETTE)
    assert overlay.mode == "RGB" and overlay.width == 50 and overlay.height > 37  # the legend below the image


def test_demo_names_a_file_that_is_not_an_image(trained, tmp_path, capsys):
    _, checkpoint, _ = trained
    bogus = tmp_path / "notes.jpg"
    bogus.write_text("not an image")
    assert load_script("demo").cli([str(bogus), "--resume", checkpoint, "--out-dir", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.jpg" in err[0] and "cannot decode image" in err[0]
    assert not (tmp_path / "o").exists()  # inputs are checked before any work
