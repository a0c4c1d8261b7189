"""Batched sliding windows: SlidingWindow / MultiEvalModule / encoding.segment run several windows per forward, with
the labels of one window at a time, as many windows as the memory allowed to them holds."""
import numpy as np
from PIL import Image
import pytest
import torch
from torch import nn

import encoding
from encoding.inference import ModelInfo
from encoding.inference.predict import InferenceOptionError, WindowBudget, inference_module, window_bytes
from encoding.models import MultiEvalModule, SlidingWindow, get_segmentation_model


@pytest.fixture(scope="module")
def unet():
    """The main job's network (shapes recipe: unet on vgg_tiny_s2, output stride 8), untrained."""
    torch.manual_seed(0)
    model = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny_s2", output_stride=8).eval()
    model.info = ModelInfo.of_dataset("shapes", crop_size=32, base_size=72)
    return model


class Recorder(nn.Module):
    """The model, remembering the batch size of each forward."""

    def __init__(self, model):
        super().__init__()
        self.model, self.batches = model, []

    def forward(self, x):
        self.batches.append(x.shape[0])
        return self.model(x)


def assert_same_labels(batched, single):
    assert torch.equal(batched.argmax(1), single.argmax(1))
    torch.testing.assert_close(batched, single, rtol=1e-5, atol=1e-5)


# sizes that are not multiples of the stride (21), one smaller than the window in a dimension, one exactly a window
@pytest.mark.parametrize("size", [(50, 77), (23, 130), (32, 32), (61, 44)])
def test_batched_windows_give_the_labels_of_one_window_at_a_time(unet, size):
    torch.manual_seed(1)
    image = torch.randn(2, 3, *size)
    with torch.no_grad():
        single = SlidingWindow(unet, 32, flip=True)(image)
        for batch in (2, 5, 1000):
            recorder = Recorder(unet)
            batched = SlidingWindow(recorder, 32, flip=True, window_batch=batch)(image)
            assert_same_labels(batched, single)
            windows = sum(recorder.batches) // 2 // 2  # two images, each window with its flip
            assert max(recorder.batches) == 2 * min(batch, windows)


def test_multi_scale_windows_batched_give_the_labels_of_one_window_at_a_time(unet):
    torch.manual_seed(2)
    for size in ((45, 71), (70, 33)):
        image = torch.randn(1, 3, *size)
        single = MultiEvalModule(unet, 7, base_size=72, crop_size=32, scales=(0.75, 1.0, 1.5))(image)
        recorder = Recorder(unet)
        batched = MultiEvalModule(recorder, 7, base_size=72, crop_size=32, scales=(0.75, 1.0, 1.5),
                                  window_batch=4)(image)
        assert_same_labels(batched, single)
        assert max(recorder.batches) == 4 and recorder.batches.count(4) > 2


@pytest.mark.parametrize("window, stride", [(22, 15), (23, 13), (39, 31), (32, 21)])
def test_multi_scale_windows_step_by_the_stride_given(unet, window, stride):
    """``segment(scales=..., stride=S)`` steps by S pixels: the rate ``S / window`` rounded back to S - 1."""
    module = inference_module(unet, scales=(1.0,), window=window, stride=stride)
    assert module.stride == stride
    assert inference_module(unet, scales=(1.0,), window=window).stride == int(window * 2 / 3)  # PE's default


def test_a_one_pixel_strip_is_segmented_at_every_scale(unet):
    """A 400 x 1 strip: its short side at scale 1 rounded to 0 pixels, a raw error of the interpolation."""
    strip = np.random.default_rng(4).integers(0, 256, (400, 1, 3), dtype=np.uint8)
    for image in (strip, strip.transpose(1, 0, 2)):
        assert tuple(encoding.segment(unet, image, scales=(1.0, 0.5)).shape) == image.shape[:2]


def test_segment_batches_windows_by_memory_and_keeps_the_labels(unet):
    image = np.random.default_rng(3).integers(0, 256, (97, 150, 3), dtype=np.uint8)
    single = encoding.segment(unet, image, mode="slide", window=32, window_batch=1)
    assert torch.equal(encoding.segment(unet, image, mode="slide", window=32), single)  # default budget
    assert torch.equal(encoding.segment(unet, image, mode="slide", window=32, window_batch=7), single)
    multi = encoding.segment(unet, image, scales=(0.5, 1.0), window=32, window_batch=1, flip=True)
    assert torch.equal(encoding.segment(unet, image, scales=(0.5, 1.0), window=32, flip=True), multi)


def test_the_window_batch_is_what_the_memory_holds(unet):
    """window_memory bytes hold memory // window_bytes windows, and the simulated peak of that batch is within it."""
    window = torch.zeros(1, 3, 32, 32)
    with torch.no_grad():
        one = window_bytes(unet, window, flip=True)
        budget = WindowBudget(unet, 3 * one + one // 2, flip=True)
        assert budget(window) == 3
        assert window_bytes(unet, torch.zeros(3, 3, 32, 32), flip=True) <= 3 * one + one // 2
        assert WindowBudget(unet, one - 1)(window) == 1  # less than one window: one at a time
        assert WindowBudget(unet, "1GiB")(window) == 2 ** 30 // window_bytes(unet, window)
    recorder = Recorder(unet)
    recorder.info = None
    inference_module(recorder, mode="slide", window=32, window_memory=3 * one + one // 2, flip=True)(
        torch.randn(1, 3, 70, 100))
    assert set(recorder.batches) == {3, 1} or set(recorder.batches) == {3}


def test_window_batch_options_are_checked(unet):
    image = np.zeros((40, 40, 3), np.uint8)
    for keywords, message in (({"window_batch": 0}, "window_batch must be a positive number of windows, got 0"),
                              ({"window_batch": 2, "window_memory": "1GiB"}, "give one"),
                              ({"window_memory": "lots"}, "window_memory: cannot read memory size 'lots'")):
        with pytest.raises(InferenceOptionError, match=message):
            encoding.segment(unet, image, mode="slide", window=32, **keywords)
    with pytest.raises(ValueError, match="window_batch / window_memory are options of mode='slide'"):
        encoding.segment(unet, image, window_batch=4)
    from encoding.config.parser import build_parser
    from encoding.inference.predict import DEFAULT_WINDOW_MEMORY
    (action,) = [a for a in build_parser("test")._actions if "--window-batch" in a.option_strings]
    assert f"as many as {DEFAULT_WINDOW_MEMORY >> 20} MiB holds on a CPU" in action.help  # the help says the default


@pytest.mark.parametrize("scales", [(0.0,), (-1.0,), (float("nan"),), (float("inf"),), (1.0, 0), "1", (True,)])
def test_scales_that_are_not_finite_numbers_above_zero_are_refused_in_one_line(unet, scales):
    """Before: torch's RuntimeError (sizes 0 / negative), ValueError (NaN to int), OverflowError, TypeError."""
    with pytest.raises(InferenceOptionError) as err:
        encoding.segment(unet, np.zeros((40, 40, 3), np.uint8), scales=scales)
    assert str(err.value).startswith("scales") and "\n" not in str(err.value)
    with pytest.raises(InferenceOptionError):
        MultiEvalModule(unet, 7, base_size=72, crop_size=32, scales=scales)


def test_scales_whose_largest_image_is_over_the_pixel_limit_are_refused_before_any_forward(unet, monkeypatch):
    """Before: scales=(1000.0,) tried to allocate 212 GB. The largest resized image is checked against the pixel
    limit of decoded images (ENCODING_MAX_PIXELS) before anything is resized or run."""
    recorder = Recorder(unet)
    recorder.info = unet.info  # base_size 72: a 40 x 60 image at scale 10 is 480 x 720 = 345,600 pixels
    monkeypatch.setenv("ENCODING_MAX_PIXELS", "300000")
    with pytest.raises(InferenceOptionError) as err:
        encoding.segment(recorder, np.zeros((40, 60, 3), np.uint8), scales=(1.0, 10.0))
    message = str(err.value)
    assert "\n" not in message and message.startswith("scales (1.0, 10.0)") and "480 x 720" in message
    assert "300,000" in message and recorder.batches == []
    monkeypatch.setenv("ENCODING_MAX_PIXELS", "400000")
    assert encoding.segment(recorder, np.zeros((40, 60, 3), np.uint8), scales=(1.0, 10.0)).shape == (40, 60)


def test_numpy_ints_are_taken_as_window_stride_and_batch(unet):
    """Before: window=np.int64(64) passed segment's check, then SlidingWindow raised a TypeError."""
    image = np.random.default_rng(0).integers(0, 256, (50, 77, 3), dtype=np.uint8)
    expected = encoding.segment(unet, image, mode="slide", window=32, stride=21, window_batch=2)
    got = encoding.segment(unet, image, mode="slide", window=np.int64(32), stride=np.int32(21),
                           window_batch=np.int64(2))
    assert torch.equal(got, expected)
    assert SlidingWindow(unet, np.int64(32)).window == (32, 32)


class HostRead(nn.Module):
    """A network that reads a value on the host: fake tensors cannot simulate it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x) * float(x.abs().max().numpy() > -1)


def test_a_model_the_simulation_cannot_run_goes_one_window_at_a_time():
    recorder = Recorder(HostRead().eval())
    with pytest.warns(RuntimeWarning, match="could not be simulated.*one window per forward"):
        encoding.segment(recorder, torch.randn(3, 40, 50), mode="slide", window=16)
    assert set(recorder.batches) == {1}


def test_test_py_window_batch_keeps_the_scores_and_the_predictions(shapes_root, tmp_path, capsys):
    from conftest import load_script, tiny_eval_set
    from encoding.utils import save_checkpoint

    torch.manual_seed(0)
    net = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny_s2")
    checkpoint = str(tmp_path / "model_best.pth")
    save_checkpoint({"model": net, "args": {"dataset": "shapes", "model": "unet", "backbone": "vgg_tiny_s2",
                                            "crop_size": 32, "base_size": 40}}, checkpoint)
    runs = {}
    for batch in ("1", "5", None):
        out = tmp_path / f"batch{batch}"
        argv = ["--workers", "0", "--resume", checkpoint, "--mode", "slide", "--window", "24", "--out-dir", str(out),
                "--save-pred", str(out / "pred")] + (["--window-batch", batch] if batch else [])
        runs[batch] = load_script("test").main(argv, data=tiny_eval_set(shapes_root, "testval"))
        runs[batch]["pred"] = {p.name: np.array(Image.open(p)) for p in sorted((out / "pred").glob("*.png"))}
    assert runs["1"]["pred"]
    for batch in ("5", None):
        assert runs[batch]["mIoU"] == runs["1"]["mIoU"] and runs[batch]["pred"].keys() == runs["1"]["pred"].keys()
        assert all(np.array_equal(runs[batch]["pred"][k], v) for k, v in runs["1"]["pred"].items())
    with pytest.raises(encoding.errors.UsageError, match="--window-batch 4: no windows run"):  # 40 px within 48
        load_script("test").main(["--workers", "0", "--resume", checkpoint, "--window-batch", "4", "--crop-size", "48"],
                                 data=tiny_eval_set(shapes_root, "testval"))
