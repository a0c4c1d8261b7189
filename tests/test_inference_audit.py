"""The inference audit's fixes: the sizes mode='slide' / scales need refused in one line where model.info records
none, float16 / float64 tensors segmented as their float32 copies, --save-pred never writing two outputs to one file,
and --window-batch taken by test.py and demo.py exactly where windows run."""
import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

import encoding
from conftest import load_script, tiny_eval_set
from encoding.datasets.shapes import SHAPES_PALETTE
from encoding.errors import UsageError
from encoding.inference import ModelInfo
from encoding.inference.error_maps import ErrorMaps
from encoding.inference.evaluation import EvaluationConfig, PredictionWriter, evaluation_module
from encoding.inference.predict import InferenceOptionError, inference_module
from encoding.models import get_segmentation_model
from encoding.utils import save_checkpoint


@pytest.fixture(scope="module")
def fcn():
    """An untrained tiny FCN whose info records the shapes classes and no training sizes."""
    torch.manual_seed(0)
    model = get_segmentation_model("fcn", dataset="shapes", backbone="vgg_tiny").eval()
    model.info = dataclasses.replace(ModelInfo.of_dataset("shapes"), crop_size=None, base_size=None)
    return model


@pytest.fixture(scope="module")
def run(shapes_root, tmp_path_factory):
    """(data root, an untrained checkpoint of the tiny recipe: crop 32, base 40)."""
    torch.manual_seed(0)
    net = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny_s2")
    path = str(tmp_path_factory.mktemp("audit_run") / "model_best.pth")
    save_checkpoint({"model": net, "args": {"dataset": "shapes", "model": "unet", "backbone": "vgg_tiny_s2",
                                            "crop_size": 32, "base_size": 40}}, path)
    return shapes_root, path


@pytest.mark.parametrize("keywords, size, argument", [
    ({"mode": "slide"}, "crop_size", "window=N"),
    ({"scales": (1.0,)}, "crop_size", "window=N"),
    ({"scales": (1.0,), "window": 32}, "base_size", "base_size=N"),
])
def test_sizes_the_windows_need_are_refused_in_one_line_where_info_records_none(fcn, keywords, size, argument):
    image = np.zeros((30, 40, 3), np.uint8)
    message = f"model.info records no {size} .*{argument}"
    with pytest.raises(InferenceOptionError, match=message):
        encoding.segment(fcn, image, **keywords)
    with pytest.raises(InferenceOptionError, match=message):
        inference_module(fcn, **keywords)
    assert encoding.segment(fcn, image, mode="slide", window=16).shape == (30, 40)


def test_test_py_and_demo_py_refuse_the_missing_size_as_segment_does(fcn):
    config = EvaluationConfig(resume="model_best.pth", model="fcn", backbone="vgg_tiny")  # testval: scale 1.0
    with pytest.raises(InferenceOptionError, match=r"scales=\(1.0,\): model.info records no crop_size"):
        evaluation_module(fcn, config)
    config = EvaluationConfig(resume="model_best.pth", model="fcn", backbone="vgg_tiny", inference="slide", stride=8)
    with pytest.raises(InferenceOptionError, match="mode='slide' without a window: model.info records no crop_size"):
        evaluation_module(fcn, config)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_a_float64_or_float16_tensor_gives_the_labels_of_its_float32_copy(fcn, dtype):
    image = torch.from_numpy(np.random.default_rng(0).random((3, 40, 50))).to(dtype)
    for keywords in ({}, {"mode": "slide", "window": 32, "stride": 20}):
        assert torch.equal(encoding.segment(fcn, image, **keywords), encoding.segment(fcn, image.float(), **keywords))
    twin = get_segmentation_model("fcn", dataset="shapes", backbone="vgg_tiny").double().eval()
    assert encoding.segment(twin, image.float()).shape == (40, 50)  # a float64 network gets float64 inputs


def _named(root, names):
    """The tiny validation split (testval), its samples named ``names``."""
    data = tiny_eval_set(root, "testval")
    data.sample_name = names.__getitem__
    return data


def test_save_pred_refuses_a_prediction_that_would_replace_an_error_map_before_writing(run, tmp_path):
    base, checkpoint = run
    preds, names = tmp_path / "preds", ["0001.jpg", "errors/0001.jpg"]
    argv = ["--resume", checkpoint, "--workers", "0", "--limit", "2", "--save-pred", str(preds)]
    with pytest.raises(UsageError, match=r"the error map of '0001.jpg' and the prediction of 'errors/0001.jpg' "
                                         r"would both be written to .*errors.0001.png"):
        load_script("test").main(argv + ["--out-dir", str(tmp_path / "eval")], data=_named(base, names))
    assert not preds.exists() and not (tmp_path / "eval").exists()
    load_script("test").main(argv + ["--mode", "test"], data=_named(base, names))  # no error maps: no collision
    assert sorted(p.relative_to(preds).as_posix() for p in preds.rglob("*.png")) == ["0001.png", "errors/0001.png"]


def test_outputs_of_unnamed_samples_are_refused_at_the_first_collision_never_overwritten(tmp_path):
    writer = PredictionWriter(str(tmp_path), SHAPES_PALETTE, error_maps=True)
    maps = ErrorMaps(writer.errors_dir, len(SHAPES_PALETTE), SHAPES_PALETTE, claims=writer.claims)
    labels = torch.zeros(6, 8, dtype=torch.long)
    maps.add("0001.jpg", np.zeros((6, 8, 3), np.uint8), labels, labels)
    panel = (tmp_path / "errors" / "0001.png").read_bytes()
    with pytest.raises(UsageError, match="the error map of '0001.jpg' and the prediction of 'errors/0001.jpg'"):
        writer([labels], ["errors/0001.jpg"])
    assert (tmp_path / "errors" / "0001.png").read_bytes() == panel
    writer([labels], ["a.jpg"])
    with pytest.raises(UsageError, match="the prediction of 'a.jpg' and the prediction of 'a.png'"):
        writer([labels + 1], ["a.png"])
    assert np.array(Image.open(tmp_path / "a.png")).max() == 0
    with pytest.raises(UsageError, match="the prediction of 'a.jpg' and the prediction of 'A.jpg'.*ignoring case"):
        writer([labels + 1], ["A.jpg"])  # one file on macOS and Windows
    assert np.array(Image.open(tmp_path / "a.png")).max() == 0
    with pytest.raises(UsageError, match="the prediction of 'x.jpg' and the prediction of 'x.jpg'"):
        PredictionWriter(str(tmp_path / "twice"), SHAPES_PALETTE, names=["x.jpg", "x.jpg"])
    assert not (tmp_path / "twice").exists()


def test_window_batch_is_taken_where_windows_run_and_refused_where_none_do(run, tmp_path):
    """The tiny recipe's base 40 > crop 32: testval's scale 1.0 runs windows; with --crop-size 48 it runs none."""
    base, checkpoint = run
    argv = ["--resume", checkpoint, "--workers", "0", "--limit", "2"]
    scores = [load_script("test").main(argv + ["--out-dir", str(tmp_path / str(n))] + more, data=tiny_eval_set(
        base, "testval"))["mIoU"] for n, more in ((0, []), (1, ["--window-batch", "1"]))]
    assert scores[0] == scores[1]
    image = str(tmp_path / "photo.png")
    Image.fromarray(np.full((50, 70, 3), 90, np.uint8)).save(image)
    demo = ["--resume", checkpoint, "--out-dir", str(tmp_path / "demo"), "--window-batch", "1"]
    assert load_script("demo").main([image] + demo)
    refused = "--window-batch 1: no windows run: each image is resized to a long side of at most 40 px"
    with pytest.raises(InferenceOptionError, match=refused):
        load_script("test").main(argv + ["--window-batch", "1", "--crop-size", "48"],
                                 data=tiny_eval_set(base, "testval"))
    with pytest.raises(InferenceOptionError, match=refused):
        load_script("demo").main([image] + demo + ["--crop-size", "48", "--overwrite"])
    with pytest.raises(InferenceOptionError, match="--window-batch 1: no windows run: every image runs in one pass"):
        load_script("test").main(argv + ["--window-batch", "1", "--mode", "val"], data=tiny_eval_set(base, "val"))


def test_a_hand_built_config_evaluates_the_network_its_weights_record(tmp_path):
    """``EvaluationConfig(resume=...)`` kept the fields' defaults (the built-in run's unet) for the network options
    and refused an fcn checkpoint that test.py evaluates: it takes what the weights record, as test.py does, and a
    value given still wins (and counts as given)."""
    from encoding.config import resolve
    from encoding.config.evaluation import NETWORK_OPTIONS
    from encoding.engine.state import saved_options

    net = get_segmentation_model("fcn", dataset="shapes", backbone="vgg_tiny", output_stride=16)
    path = str(tmp_path / "model_best.pth")
    save_checkpoint({"model": net, "args": {"dataset": "shapes", "model": "fcn", "backbone": "vgg_tiny",
                                            "output_stride": 16, "crop_size": 32, "base_size": 40}}, path)
    hand = EvaluationConfig(resume=path, no_cuda=True)
    script = EvaluationConfig.from_options(resolve("test", ["--resume", path], read_saved=saved_options).namespace())
    assert {n: getattr(hand, n) for n in NETWORK_OPTIONS} == {n: getattr(script, n) for n in NETWORK_OPTIONS}
    assert (hand.model, hand.backbone, hand.output_stride, hand.crop_size) == ("fcn", "vgg_tiny", 16, 32)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(hand.network(torch.device("cpu"))(x)["out"], net.eval()(x)["out"])
    assert EvaluationConfig(resume=path, crop_size=48).crop_size == 48
    with pytest.raises(Exception, match="--base-size"):  # a given size the mode never reads is still refused
        EvaluationConfig(resume=path, mode="val", base_size=100)
    assert EvaluationConfig(resume=path, mode="val").base_size == 40  # the weights' own: not a given option


def test_a_device_other_than_the_models_is_refused_in_one_line_naming_both(fcn):
    """Before: segment(..., device="meta") moved the image only, and torch failed inside the model. segment runs the
    model where its parameters are and never moves the caller's model."""
    image = np.zeros((20, 30, 3), np.uint8)
    with pytest.raises(InferenceOptionError) as err:
        encoding.segment(fcn, image, device="meta")
    message = str(err.value)
    assert "\n" not in message and "'meta'" in message and "cpu" in message and "model.to(" in message
    with pytest.raises(InferenceOptionError, match="device 'gpu'"):
        encoding.segment(fcn, image, device="gpu")
    assert all(p.device.type == "cpu" for p in fcn.parameters())
    assert torch.equal(encoding.segment(fcn, image, device=torch.device("cpu")), encoding.segment(fcn, image))


def test_demo_py_labels_are_segment_at_the_training_scale(tmp_path):
    """docs/inference.md: demo.py's (and test.py's) whole-image labels are segment(model, image, scales=(1.0,)): the
    image resized to the recorded base_size (40 here, the image's long side 130), not segment's default pass."""
    torch.manual_seed(0)
    net = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny_s2")
    path = str(tmp_path / "model_best.pth")
    save_checkpoint({"model": net, "args": {"dataset": "shapes", "model": "unet", "backbone": "vgg_tiny_s2",
                                            "crop_size": 32, "base_size": 40}}, path)
    image = str(tmp_path / "img.png")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (90, 130, 3), dtype=np.uint8)).save(image)
    outputs = load_script("demo").main([image, "--resume", path, "--out-dir", str(tmp_path / "out")])
    saved = np.array(Image.open(outputs[0][0]))
    model = encoding.load_model(path)
    np.testing.assert_array_equal(saved, encoding.segment(model, image, scales=(1.0,)).numpy())
