"""experiments/segmentation/test.py and demo.py, end to end on a tiny generated `shapes` split (CPU)."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import SCRIPTS, load_script, tiny_eval_set
from encoding.datasets.shapes import SHAPES_CLASSES, SHAPES_PALETTE
from encoding.inference.evaluation import read_image
from encoding.inference.loading import load_model
from encoding.inference.predict import segment
from encoding.engine.state import read
from encoding.models import get_segmentation_model
from encoding.utils import SegmentationMetric, load_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# 5 validation images (conftest's tiny_run): two processes get 3 + 2

# Runs test.py on the tiny validation set (what run_test does in-process), e.g. under torchrun.
LAUNCHER = """
import sys
sys.path[:0] = [{tests!r}, {scripts!r}]
from conftest import tiny_eval_set
import test
sys.exit(test.cli(sys.argv[1:], data=tiny_eval_set(mode="testval")))
"""


@pytest.fixture(scope="module")
def trained(tiny_run):
    """One epoch of train.py on the tiny split: (data root, checkpoint path, the run's last validation result)."""
    return tiny_run


def run_test(*argv, root, mode="testval"):
    return load_script("test").main(["--workers", "0", *argv], data=tiny_eval_set(root, mode))


def read_metrics(folder):
    with open(os.path.join(folder, "metrics.json")) as f:
        return json.load(f)


def val_images(base):
    return tiny_eval_set(base, "test").images


def test_test_py_reproduces_the_last_validation(trained, tmp_path):
    base, checkpoint, result = trained
    scores = run_test("--resume", checkpoint, "--mode", "val", "--out-dir", str(tmp_path), root=base, mode="val")
    saved = read_metrics(tmp_path)
    for key in ("pixAcc", "mIoU"):
        assert scores[key] == result[key]
        assert saved[key] == pytest.approx(result[key], abs=1e-12)
    assert list(saved)[0] == "protocol" and saved["protocol"] == "resized centre crops of 32 px"
    assert saved["split"] == "val" and saved["mode"] == "val" and saved["weights"] == checkpoint
    assert list(saved["per_class"]) == list(SHAPES_CLASSES)
    # the network options came from the checkpoint: nothing but --resume was needed
    assert load_checkpoint(checkpoint)["args"]["model"] == "unet"


def test_whole_images_are_the_default_protocol(trained, tmp_path, capsys):
    """test.py scores each image whole at its size, the network seeing it at the training scale (PE's --eval at
    scale 1, mmseg's test resize), says so first in metrics.json and above the table; the crops training
    validates on are the explicit --mode val."""
    base, checkpoint, _ = trained
    scores = run_test("--resume", checkpoint, "--out-dir", str(tmp_path), root=base)
    saved = read_metrics(tmp_path)
    scoring = "whole images at the training scale"
    assert list(saved)[0] == "protocol" and saved["protocol"] == scoring and saved["mode"] == "testval"
    out = capsys.readouterr().out
    assert f"{scoring} (val split):\nclass" in out and f"mIoU {scores['mIoU']:.4f} ({scoring})" in out
    model, metric = load_model(checkpoint), SegmentationMetric(len(SHAPES_CLASSES))
    pixels = 0
    for image, mask, _ in tiny_eval_set(base, "testval"):
        metric.update(segment(model, image, scales=[1.0]).unsqueeze(0), mask.unsqueeze(0))
        pixels += int((mask != -1).sum())
    torch.testing.assert_close(scores["confusion"], metric.compute()["confusion"], rtol=0, atol=0)
    assert int(scores["confusion"].sum()) == pixels and saved["mIoU"] == pytest.approx(metric.compute()["mIoU"])
    crops = run_test("--resume", checkpoint, "--mode", "val", "--out-dir", str(tmp_path / "crops"), root=base,
                     mode="val")
    assert int(crops["confusion"].sum()) != pixels  # the two protocols score different pixels


def test_the_protocol_names_what_is_scored():
    from encoding.config.evaluation import protocol
    from encoding.inference.evaluation import EvaluationConfig
    assert protocol(EvaluationConfig()) == "whole images at the training scale"
    assert protocol(EvaluationConfig(mode="val", crop_size=64)) == "resized centre crops of 64 px"
    assert protocol(EvaluationConfig(inference="slide", crop_size=30)) == "whole images, sliding windows 30 / stride 20"
    assert protocol(EvaluationConfig(multi_scale=True, scales=(0.75, 1.0))) == "whole images, scales 0.75, 1 + flip"
    assert protocol(EvaluationConfig(split="test", save_pred="preds")) == "predictions only"


def test_save_pred_leaves_the_score_unchanged(trained, tmp_path):
    base, checkpoint, _ = trained
    for mode in ("testval", "slide"):
        plain = run_test("--resume", checkpoint, "--mode", mode, "--out-dir", str(tmp_path / mode / "plain"),
                         root=base)
        saved = run_test("--resume", checkpoint, "--mode", mode, "--out-dir", str(tmp_path / mode / "saved"),
                         "--save-pred", str(tmp_path / mode / "preds"), root=base)
        torch.testing.assert_close(saved["confusion"], plain["confusion"], rtol=0, atol=0)
        first, second = read_metrics(tmp_path / mode / "plain"), read_metrics(tmp_path / mode / "saved")
        assert first["mIoU"] == second["mIoU"] and first["pixAcc"] == second["pixAcc"]
        assert first["protocol"] == second["protocol"]
        assert len(os.listdir(tmp_path / mode / "preds")) == len(val_images(base)) + 1  # + errors/


@pytest.mark.parametrize("mode", ["val", "testval"])
def test_the_progress_bar_ends_with_the_final_score(trained, tmp_path, capsys, monkeypatch, mode):
    """Piped into a log, the bar's last line (100 %) shows the scores test.py then prints, not those of the last
    refresh (batch 0 of 5 here)."""
    base, checkpoint, _ = trained
    monkeypatch.setenv("ENCODING_PROGRESS", "lines")
    batch = ["--test-batch-size", "1"] if mode == "val" else []  # an option of --mode val alone
    scores = run_test("--resume", checkpoint, "--mode", mode, *batch, "--out-dir", str(tmp_path), root=base, mode=mode)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval")]
    assert "100%" in lines[-1] and "5/5" in lines[-1], lines
    assert f"mIoU={scores['mIoU']:.4f}" in lines[-1] and f"pixAcc={scores['pixAcc']:.4f}" in lines[-1], lines
    assert sum("100%" in line for line in lines) == 1


def test_two_cpu_devices_score_like_one(trained, tmp_path):
    base, checkpoint, _ = trained
    one = run_test("--resume", checkpoint, "--mode", "val", "--out-dir", str(tmp_path / "one"), root=base, mode="val")
    two = run_test("--resume", checkpoint, "--mode", "val", "--out-dir", str(tmp_path / "two"), "--device-ids",
                   "cpu,cpu", "--test-batch-size", "3", root=base, mode="val")
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
                           str(tmp_path / "two"), "--save-pred", str(tmp_path / "preds")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    two = read_metrics(tmp_path / "two")
    assert two["pixAcc"] == pytest.approx(one["pixAcc"], abs=1e-12)
    assert two["mIoU"] == pytest.approx(one["mIoU"], abs=1e-12)
    # each process wrote the error maps of its shard; rank 0 drew the worst images of both (gathered)
    assert len(os.listdir(tmp_path / "preds" / "errors")) == len(val_images(base))
    gallery = Image.open(tmp_path / "two" / "worst_images.png")
    assert gallery.height == 16 + len(val_images(base)) * (14 + 160)


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
    assert load_script("demo").cli([str(bogus), "--resume", checkpoint, "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "notes.jpg" in err[0] and "cannot decode image" in err[0]
    assert not (tmp_path / "o").exists()  # inputs are checked before any work


# ------------------------------------------------------------------ round 2: demo outputs, odd images, memory, help
def _photo(base, path, size=None):
    image = Image.open(val_images(base)[0]).convert("RGB")
    image = image.resize(size) if size else image
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)
    return image


def _demo_modules(script):
    """The demo script and the library module that does its work (where the names to patch are bound)."""
    import importlib
    try:
        return [script, importlib.import_module("encoding.inference.demo")]
    except ImportError:
        return [script]


def test_demo_keeps_inputs_of_the_same_name_apart_and_refuses_to_replace_outputs(trained, tmp_path, capsys):
    base, checkpoint, _ = trained
    first, second = _photo(base, tmp_path / "a" / "x.png"), _photo(base, tmp_path / "b" / "x.png", (40, 30))
    out = tmp_path / "out"
    demo = load_script("demo")
    written = demo.main([str(tmp_path / "a" / "x.png"), str(tmp_path / "b" / "x.png"), "--resume", checkpoint,
                         "--out-dir", str(out)])
    assert written == [(str(out / d / "x_mask.png"), str(out / d / "x_overlay.png")) for d in ("a", "b")]
    assert Image.open(written[0][0]).size == first.size and Image.open(written[1][0]).size == second.size
    # same stem in one folder: the extension keeps them apart
    _photo(base, tmp_path / "c" / "y.png"), _photo(base, tmp_path / "c" / "y.jpg")
    pair = demo.main([str(tmp_path / "c" / "y.png"), str(tmp_path / "c" / "y.jpg"), "--resume", checkpoint,
                      "--out-dir", str(tmp_path / "out2")])
    assert len({m for m, _ in pair}) == 2 and all(os.path.isfile(m) for m, _ in pair)
    # a second run into the same folder is refused, in one line naming the file, and changes nothing
    before = os.path.getmtime(written[0][0])
    argv = [str(tmp_path / "a" / "x.png"), str(tmp_path / "b" / "x.png"), "--resume", checkpoint, "--out-dir", str(out)]
    capsys.readouterr()
    assert demo.cli(argv) == 2  # a refusal before any work (was 1, a failed run's status)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "x_mask.png exists" in err[0] and "--overwrite" in err[0]
    assert os.path.getmtime(written[0][0]) == before
    assert demo.cli(argv + ["--overwrite"]) == 0


def test_demo_reads_16_bit_exif_rotated_and_tiny_images(trained, tmp_path):
    base, checkpoint, _ = trained
    rgb = np.asarray(_photo(base, tmp_path / "eight.png"))
    grey8 = rgb.mean(axis=2).round().astype(np.uint8)
    Image.fromarray(grey8).save(tmp_path / "eight.png")
    Image.fromarray(grey8.astype(np.uint16) * 257).save(tmp_path / "sixteen.png")  # 16-bit PNG, same picture
    assert Image.open(tmp_path / "sixteen.png").mode.startswith("I")
    stored = Image.fromarray(rgb[:, : rgb.shape[1] // 2])  # not square: a rotation changes its size
    exif = stored.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    stored.save(tmp_path / "phone.jpg", exif=exif.tobytes())
    Image.fromarray(rgb[:20, :3]).save(tmp_path / "narrow.png")
    names = ["eight.png", "sixteen.png", "phone.jpg", "narrow.png"]
    written = load_script("demo").main([str(tmp_path / n) for n in names] + ["--resume", checkpoint,
                                                                             "--out-dir", str(tmp_path / "out")])
    masks = [np.asarray(Image.open(m)) for m, _ in written]
    np.testing.assert_array_equal(masks[1], masks[0])  # the 16-bit image is the 8-bit one, not white
    np.testing.assert_array_equal(read_image(str(tmp_path / "sixteen.png")), read_image(str(tmp_path / "eight.png")))
    assert masks[2].shape == (stored.width, stored.height)  # the displayed (upright) orientation
    assert masks[3].shape == (20, 3)


def test_demo_leaves_no_partial_output_when_an_image_fails(trained, tmp_path, monkeypatch):
    base, checkpoint, _ = trained
    _photo(base, tmp_path / "x.png")
    demo = load_script("demo")

    def broken(*args, **kwargs):
        raise RuntimeError("overlay failed")
    for module in _demo_modules(demo):
        if hasattr(module, "overlay_with_legend"):
            monkeypatch.setattr(module, "overlay_with_legend", broken)
    assert demo.cli([str(tmp_path / "x.png"), "--resume", checkpoint,
                                    "--out-dir", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists() or not [f for f in os.listdir(tmp_path / "out")]


def test_demo_holds_one_image_at_a_time(trained, tmp_path, monkeypatch):
    """Peak memory independent of the number of images: at most one decoded image is alive while segmenting."""
    import weakref
    base, checkpoint, _ = trained
    paths = [str(_photo(base, tmp_path / f"{i}.png") and tmp_path / f"{i}.png") for i in range(4)]
    import encoding.inference.evaluation as inference
    alive, most = [], []
    original = inference.read_image

    def tracked(path):
        image = original(path)
        alive.append(weakref.ref(image))
        return image

    def counting_segment(model, image, **options):
        most.append(sum(ref() is not None for ref in alive))
        return segment(model, image, **options)
    demo = load_script("demo")
    for module in _demo_modules(demo):
        for name, patched in (("read_image", tracked), ("segment", counting_segment)):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, patched)
    demo.main(paths + ["--resume", checkpoint, "--out-dir", str(tmp_path / "out")])
    assert len(most) == 4 and max(most) == 1, most


def test_demo_help_lists_only_what_demo_uses_and_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        load_script("demo").main(["--help"])
    text = capsys.readouterr().out
    for unused in ("--workers", "--amp", "--device-ids", "--seed", "--data-root"):
        assert unused not in text
    assert "(default: 0.5)" in text and "--blend-background" in text and "--overwrite" in text


@pytest.mark.parametrize("argv, message", [
    (["--mode", "val", "--base-size", "100"], "--base-size is the size whole images are resized to .*--mode val "
                                              "crops at --crop-size"),
    (["--mode", "slide", "--base-size", "100"], "--mode slide runs each image at its own size"),
    (["--mode", "slide", "--window", "64", "--crop-size", "32"], "--crop-size is --mode slide's window when "
                                                                 "--window is not given"),
    (["--mode", "test"], "--mode test predicts without scoring .* pass --save-pred DIR"),
    (["--mode", "test", "--save-pred", "P", "--out-dir", "O"], "--out-dir is where the scores .* go; --mode test "
                                                               "scores nothing"),
])
def test_options_a_mode_never_reads_are_refused(trained, tmp_path, capsys, argv, message):
    """Each was accepted and changed nothing: the same scores with and without it, or (--mode test) nothing
    written at all."""
    _, checkpoint, _ = trained
    argv = [str(tmp_path / a) if a in ("P", "O") else a for a in argv]
    with pytest.raises(SystemExit) as stopped:
        load_script("test").cli(["--resume", checkpoint, "--workers", "0", *argv])
    assert stopped.value.code == 2
    assert re.search(message, capsys.readouterr().err)
    assert os.listdir(tmp_path) == []


def test_the_python_evaluation_config_refuses_what_the_command_line_refuses():
    """EvaluationConfig(scales=...) without multi_scale, or test_batch_size outside mode val, was set and never
    read (the command line refused both)."""
    from encoding.config import ConfigError
    from encoding.inference.evaluation import EvaluationConfig

    with pytest.raises(ConfigError, match="--scales is an option of --multi-scale"):
        EvaluationConfig(resume="x.pth", scales=(0.5,))
    with pytest.raises(ConfigError, match="--test-batch-size is the batch of --mode val"):
        EvaluationConfig(resume="x.pth", test_batch_size=4)
    with pytest.raises(ConfigError, match="--base-size is the size whole images are resized to"):
        EvaluationConfig(resume="x.pth", mode="val", base_size=100)
    assert EvaluationConfig(resume="x.pth", multi_scale=True, scales=(0.5,)).scales == (0.5,)
    assert EvaluationConfig(resume="x.pth", mode="val", test_batch_size=4).test_batch_size == 4


@pytest.mark.parametrize("real", [False, True], ids=["no-file", "checkpoint"])
@pytest.mark.parametrize("options", [{}, {"multi_scale": True}, {"inference": "slide", "crop_size": 30},
                                     {"mode": "val", "crop_size": 30}, {"split": "test", "save_pred": "preds"}])
def test_a_completed_evaluation_config_is_copied_and_rebuilt_as_it_is(options, real, tiny_run):
    """``dataclasses.replace`` and a rebuild from the fields raised ConfigError (``--scales is an option of
    --multi-scale``): the scales, batch and window the rules filled in counted as given the second time; with a
    real checkpoint, the sizes taken from it did (``--base-size is the size whole images are resized to``)."""
    import dataclasses
    from encoding.config import ConfigError
    from encoding.inference.evaluation import EvaluationConfig

    resume = tiny_run[1] if real else "x.pth"
    config = EvaluationConfig(resume=resume, **options)
    assert dataclasses.replace(config, limit=3) == EvaluationConfig(resume=resume, limit=3, **options)
    assert EvaluationConfig(**dataclasses.asdict(config)) == config
    if not config.multi_scale:  # a value changed is still given, and refused where the mode never reads it
        with pytest.raises(ConfigError, match="--scales is an option of --multi-scale"):
            dataclasses.replace(config, scales=(0.5,))


@pytest.mark.parametrize("options, message", [
    ({"mode": "test"}, "--mode test predicts without scoring .* pass --save-pred DIR"),
    ({"split": "test"}, "--mode test predicts without scoring .* pass --save-pred DIR"),
    ({"inference": "slide", "crop_size": 30, "mode": "test"}, "--mode test predicts without scoring"),
    ({"mode": "test", "save_pred": "P", "out_dir": "O"}, "--out-dir is where the scores .* go; --mode test "
                                                         "scores nothing"),
])
def test_the_python_evaluation_config_refuses_a_mode_test_that_writes_nothing(options, message):
    """test.py refused these; a hand-built EvaluationConfig took them and build_evaluation predicted into nothing."""
    from encoding.config import ConfigError
    from encoding.inference.evaluation import EvaluationConfig

    with pytest.raises(ConfigError, match=message):
        EvaluationConfig(resume="x.pth", **options)
    assert EvaluationConfig(resume="x.pth", split="test", save_pred="P").mode == "test"


def test_an_earlier_evaluations_pictures_do_not_stay_beside_new_scores(trained, tmp_path):
    """worst_images.png of a --save-pred evaluation stayed beside the metrics.json of the next one (without
    --save-pred, or in another mode), as if it showed that evaluation's worst images."""
    base, checkpoint, _ = trained
    out = tmp_path / "scores"
    run_test("--resume", checkpoint, "--out-dir", str(out), "--save-pred", str(tmp_path / "preds"), root=base)
    assert (out / "worst_images.png").is_file() and (out / "confusion.png").is_file()
    run_test("--resume", checkpoint, "--out-dir", str(out), root=base)
    assert not (out / "worst_images.png").exists() and (out / "confusion.png").is_file()
    assert read_metrics(out)["mode"] == "testval"
