"""encoding.load_model / encoding.segment and the sliding-window inference (SlidingWindow, test.py --mode slide)."""
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

import encoding
from conftest import load_script, tiny_eval_set
from encoding.datasets.shapes import SHAPES_CLASSES, SHAPES_PALETTE
from encoding.inference.predict import to_batch
from encoding.models import MultiEvalModule, SlidingWindow, get_segmentation_model


def run_test(*argv, root, mode="testval"):
    return load_script("test").main(["--workers", "0", *argv], data=tiny_eval_set(root, mode))


def saved_labels(folder, path):
    """The class ids of test.py's palettised prediction PNG of the input ``path``."""
    return np.array(Image.open(os.path.join(folder, os.path.splitext(os.path.basename(path))[0] + ".png")))


def test_load_model_and_segment_give_test_py_labels(tiny_run, tmp_path):
    """A checkpoint path is enough: the network, its classes, palette and sizes come back, and its labels of every
    validation image equal test.py --save-pred's, whole and by sliding windows."""
    base, checkpoint, _ = tiny_run
    model = encoding.load_model(checkpoint)
    assert not model.training and model.info.classes == tuple(SHAPES_CLASSES)
    assert model.info.palette == tuple(tuple(c) for c in SHAPES_PALETTE) and model.info.crop_size == 32
    whole, slide = tmp_path / "whole", tmp_path / "slide"
    run_test("--resume", checkpoint, "--save-pred", str(whole), "--out-dir", str(tmp_path), root=base)
    run_test("--resume", checkpoint, "--mode", "slide", "--window", "64", "--stride", "48", "--save-pred", str(slide),
             "--out-dir", str(tmp_path), root=base)
    with open(tmp_path / "metrics.json") as f:
        report = json.load(f)
    assert report["mode"] == "testval" and report["inference"] == "slide"
    images = tiny_eval_set(base, "test").images
    for path in images:
        labels = encoding.segment(model, path)
        np.testing.assert_array_equal(labels.numpy(), saved_labels(whole, path))
        windows = encoding.segment(model, path, mode="slide", window=64, stride=48)
        np.testing.assert_array_equal(windows.numpy(), saved_labels(slide, path))
        assert labels.shape == Image.open(path).size[::-1]
    assert min(Image.open(p).size[0] for p in images) > 64  # several windows per image


def test_segment_takes_paths_pil_arrays_and_tensors(tiny_run):
    _, checkpoint, _ = tiny_run
    model = encoding.load_model(checkpoint, device="cpu")
    path = tiny_eval_set(tiny_run[0], "test").images[0]
    expected = encoding.segment(model, path)
    rgb = np.array(Image.open(path).convert("RGB"))
    normalised = to_batch(rgb)[0]
    for image in (Image.open(path), rgb, torch.from_numpy(rgb).permute(2, 0, 1), normalised):
        assert torch.equal(encoding.segment(model, image), expected)
    batch = encoding.segment(model, torch.stack([normalised, normalised.flip(-1)]))
    assert batch.shape == (2, *expected.shape) and torch.equal(batch[0], expected)
    with pytest.raises(ValueError, match=r"H x W / H x W x 1 \(grey\) uint8 array, got float64 \(4, 4\)"):
        encoding.segment(model, np.zeros((4, 4)))
    with pytest.raises(ValueError, match=r"got uint8 \(4, 4, 2\)"):
        encoding.segment(model, np.zeros((4, 4, 2), np.uint8))
    with pytest.raises(ValueError, match="unknown inference mode 'tile'"):
        encoding.segment(model, rgb, mode="tile")


def test_segment_takes_grey_arrays_as_it_takes_grey_files(tiny_run, tmp_path):
    """An H x W (or H x W x 1) uint8 array is grey, as a grey PNG is read: the same labels as the file's."""
    torch.manual_seed(0)
    model = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny_s2").eval()  # untrained: varied labels
    grey = np.array(Image.open(tiny_eval_set(tiny_run[0], "test").images[0]).convert("L"))
    Image.fromarray(grey).save(tmp_path / "grey.png")
    expected = encoding.segment(model, str(tmp_path / "grey.png"))
    assert expected.shape == grey.shape and len(expected.unique()) > 1
    assert torch.equal(encoding.segment(model, grey), expected)
    assert torch.equal(encoding.segment(model, grey[..., None]), expected)
    assert torch.equal(encoding.segment(model, np.repeat(grey[..., None], 3, axis=2)), expected)


def test_a_pil_image_gives_the_labels_of_its_file(tiny_run, tmp_path):
    """A PIL image is read as its file is: a 16-bit grey PNG scaled to 8 bits (not clipped to white), an EXIF-rotated
    JPEG upright."""
    torch.manual_seed(0)
    model = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny_s2").eval()  # untrained: varied labels
    grey = np.array(Image.open(tiny_eval_set(tiny_run[0], "test").images[0]).convert("L")).astype(np.uint16) * 257
    Image.fromarray(grey).save(tmp_path / "wide.png")
    rgb = np.array(Image.open(tiny_eval_set(tiny_run[0], "test").images[1]).convert("RGB"))[:, :50]
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated 90 degrees: shown upright as W x H
    Image.fromarray(rgb).save(tmp_path / "turned.jpg", exif=exif)
    for name in ("wide.png", "turned.jpg"):
        path = str(tmp_path / name)
        expected = encoding.segment(model, path)
        assert len(expected.unique()) > 1
        with Image.open(path) as image:
            assert torch.equal(encoding.segment(model, image), expected), name
    assert expected.shape == (50, rgb.shape[0])


def test_segment_scales_reuse_multieval(tiny_run):
    """scales= is PyTorch-Encoding's multi-scale evaluation, MultiEvalModule at the checkpoint's sizes."""
    _, checkpoint, _ = tiny_run
    model = encoding.load_model(checkpoint)
    image = to_batch(np.array(Image.open(tiny_eval_set(tiny_run[0], "test").images[1]).convert("RGB")))
    info = model.info
    evaluator = MultiEvalModule(model, info.num_classes, base_size=info.base_size, crop_size=info.crop_size,
                                scales=(0.75, 1.25), flip=True)
    assert torch.equal(encoding.segment(model, image, scales=(0.75, 1.25), flip=True), evaluator(image).argmax(1))


def test_load_model_of_a_plain_state_dict_needs_the_network_options(tmp_path):
    torch.manual_seed(0)
    net = get_segmentation_model("fcn", dataset="shapes", backbone="vgg_tiny").eval()
    path = tmp_path / "weights.pth"
    torch.save(net.state_dict(), path)
    with pytest.raises(ValueError, match="records no dataset, model, backbone: pass them"):
        encoding.load_model(path)
    model = encoding.load_model(path, dataset="shapes", model="fcn", backbone="vgg_tiny")
    x = torch.randn(1, 3, 24, 30)
    assert torch.equal(model(x)["out"], net(x)["out"]) and model.info.dataset == "shapes"
    with pytest.raises(FileNotFoundError, match="no such checkpoint file or preset name: 'nope.pth'"):
        encoding.load_model("nope.pth")
    with pytest.raises(ValueError, match="no published weights for the preset 'encnet_resnet50_ade'"):
        encoding.load_model("encnet_resnet50_ade")
    with pytest.raises(ValueError, match="unknown option"):
        encoding.load_model(path, colour="red")


def _tiny_model():
    torch.manual_seed(0)
    return get_segmentation_model("fcn", dataset="shapes", backbone="vgg_tiny").double().eval()


def test_slide_with_a_window_as_large_as_the_image_is_whole():
    model = _tiny_model()
    image = torch.randn(2, 3, 37, 53, dtype=torch.float64)
    with torch.no_grad():
        whole = model(image)["out"]
    assert torch.equal(SlidingWindow(model, window=(37, 53))(image), whole)
    assert torch.equal(SlidingWindow(model, window=64, stride=5)(image), whole)


def test_slide_equals_a_window_by_window_reference_in_float64():
    """mmsegmentation's grid of a 40 x 50 image, window 24, stride 16: rows 0-24, 16-40; columns 0-24, 16-40 and
    26-50 (the last one shifted back inside the image); each pixel the mean over the windows covering it."""
    model = _tiny_model()
    image = torch.randn(1, 3, 40, 50, dtype=torch.float64)
    total = np.zeros((1, len(SHAPES_CLASSES), 40, 50))
    total_flip, count = np.zeros_like(total), np.zeros((40, 50))
    with torch.no_grad():
        for top, bottom in ((0, 24), (16, 40)):
            for left, right in ((0, 24), (16, 40), (26, 50)):
                window = image[..., top:bottom, left:right]
                logits, mirrored = model(window)["out"], model(window.flip(-1))["out"].flip(-1)
                total[..., top:bottom, left:right] += logits.numpy()
                total_flip[..., top:bottom, left:right] += ((logits + mirrored) / 2).numpy()
                count[top:bottom, left:right] += 1
    out = SlidingWindow(model, window=24, stride=16)(image)
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), total / count, rtol=0, atol=1e-12)
    flipped = SlidingWindow(model, window=(24, 24), stride=(16, 16), flip=True)(image)
    np.testing.assert_allclose(flipped.numpy(), total_flip / count, rtol=0, atol=1e-12)


def test_test_py_slide_options_are_checked(tiny_run, capsys, monkeypatch):
    monkeypatch.setenv("ENCODING_DATA", str(tiny_run[0]))
    options = load_script("options")
    for argv, message in ((["--mode", "slide", "--multi-scale"], "--mode slide is single-scale"),
                          (["--window", "32"], "--window / --stride are options of --mode slide"),
                          (["--scales", "0.5,2.0"], "--scales is an option of --multi-scale"),
                          (["--test-batch-size", "4"], "--test-batch-size is the batch of --mode val; --mode "
                                                       "testval runs whole images, one per device"),
                          (["--mode", "slide", "--test-batch-size", "4"], "--mode slide runs whole images, one per "
                                                                          "device (its windows: --window-batch)")):
        with pytest.raises(SystemExit):
            options.parse_args(["--resume", tiny_run[1], *argv], "test")
        assert message in capsys.readouterr().err
    args = options.parse_args(["--resume", tiny_run[1], "--mode", "slide"], "test")
    assert (args.mode, args.inference, args.window, args.stride) == ("testval", "slide", 32, 21)
    args = options.parse_args(["--resume", tiny_run[1], "--multi-scale", "--scales", "0.5,2.0"], "test")
    assert args.scales == (0.5, 2.0)  # with the option they belong to: taken
    assert options.parse_args(["--resume", tiny_run[1], "--mode", "val", "--test-batch-size", "4"],
                              "test").test_batch_size == 4


def test_a_preset_offline_fails_in_one_line(monkeypatch, tmp_path):
    """Published weights that are not cached and cannot be downloaded: one line naming where to put the file."""
    import urllib.error

    import torchvision

    def offline(self, *args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setattr(torchvision.models.WeightsEnum, "get_state_dict", offline)
    with pytest.raises(RuntimeError) as failure:
        encoding.load_model("fcn_resnet50_voc")
    message = str(failure.value)
    assert "\n" not in message and "could not download" in message and str(tmp_path) in message


def test_a_presets_network_options_build_the_network_its_info_records(tmp_path):
    """``output_stride=16`` for a preset is built (its info recorded 16 while the network kept 8, so its shared copy
    was another network); another dataset / model / backbone is refused, and so is ``weights=`` for a checkpoint."""
    from encoding.errors import UsageError
    from encoding.models import get_model

    path = tmp_path / "fcn.pth"
    torch.save(get_model("fcn_resnet50_voc").state_dict(), path)
    model = encoding.load_model("fcn_resnet50_voc", weights=str(path), output_stride=16)
    dilations = [m.dilation[0] for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert model.info.options["output_stride"] == 16 and max(dilations) == 2  # stride 8 dilates layer4 by 4
    with pytest.raises(UsageError, match="backbone='resnet101': the preset is dataset='pascal_voc', model='fcn', "
                                         "backbone='resnet50'"):
        encoding.load_model("fcn_resnet50_voc", weights=str(path), backbone="resnet101")
    with pytest.raises(UsageError, match="weights= replaces a preset's published weights"):
        encoding.load_model(str(tmp_path / "run.pth"), weights=str(path))


@pytest.mark.gpu
def test_segment_on_a_gpu_agrees_with_the_cpu(tiny_run):
    _, checkpoint, _ = tiny_run
    path = tiny_eval_set(tiny_run[0], "test").images[0]
    cpu = encoding.segment(encoding.load_model(checkpoint), path, mode="slide", window=64, stride=48)
    gpu = encoding.segment(encoding.load_model(checkpoint, device="cuda"), path, mode="slide", window=64, stride=48)
    assert gpu.device.type == "cpu" and (gpu == cpu).float().mean() > 0.999
