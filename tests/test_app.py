"""Issue 37: the web page (``python -m encoding.app``), served on a free localhost port in a subprocess and driven by
``gradio_client`` (and once by a real headless Chromium): its mask is ``encoding.segment``'s, its memory numbers the
memory tool's, and bad input gets a message while the server keeps serving."""
import contextlib
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

import encoding
from encoding.app.planning import PlanRequest, advice_rows, device_rows, plan_argv, plan_memory
from encoding.app.segmentation import (SegmentRequest, class_shares, legend_html, parse_scales, segment_image,
                                      validation_images)
from encoding.inference import ModelInfo, save_pretrained
from encoding.errors import UsageError
from encoding.models import get_segmentation_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The tiny network's options and sizes (slide and multi-scale stay cheap).
TINY = dict(model="fcn", backbone="vgg_tiny")
#: The memory plan every check makes: a tiny network, two simulated devices, the advice under a limit.
PLAN = PlanRequest(model="fcn", backbone="vgg_tiny", dataset="shapes", crop_size=32, devices=2, memory_limit="11GiB",
                   reserve="0B", strategies=("gather", "ddp"), advise=True, recompute="none", amp="none")
START_S = 120  # the server's start (torch, gradio) on a loaded machine
REQUEST_S = 240  # the longest answer (the plan with its advice, on a loaded machine)
SCREENSHOT_ENV = "ENCODING_APP_SCREENSHOT"  # also save the browser test's screenshot there (docs/_static/app.png)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A ``save_pretrained`` folder of a tiny FCN with the ``shapes`` classes and colours (non-trivial BatchNorm
    statistics, so a missed buffer would change the labels)."""
    torch.manual_seed(0)
    model = get_segmentation_model(TINY["model"], dataset="shapes", backbone=TINY["backbone"]).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    model.info = ModelInfo.of_dataset("shapes", base_size=40, crop_size=32, **TINY)
    return str(save_pretrained(model, tmp_path_factory.mktemp("app_model") / "tiny"))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """An image, a text file named like one and a 0 x 0 PNG."""
    folder = tmp_path_factory.mktemp("app_images")
    rng = np.random.RandomState(0)
    picture = np.zeros((45, 61, 3), np.uint8) + rng.randint(0, 60, (45, 61, 3), dtype=np.uint8)
    picture[5:30, 8:40] = (230, 40, 60)  # a block of colour, so that more than one class shows
    Image.fromarray(picture).save(folder / "scene.png")
    (folder / "notes.png").write_text("not an image\n")

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    (folder / "empty.png").write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 0, 0, 8, 2, 0, 0, 0))
                                       + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    return {name: str(folder / f"{name}.png") for name in ("scene", "notes", "empty")}


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_app(argv, work, **env):
    """``python -m encoding.app ARGV --port FREE`` started in the folder ``work`` (Gradio's uploads under
    ``work/gradio`` unless ``GRADIO_TEMP_DIR`` is given in ``env``); ``{"url", "process", "log"}`` once it answers.
    Killed at the end."""
    pytest.importorskip("gradio", reason="the web page needs the app extra: pip install -e '.[app]'")
    pytest.importorskip("gradio_client", reason="the tests drive the page with gradio_client (the app extra)")
    port = _free_port()
    env = dict(os.environ, **{"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                              "GRADIO_TEMP_DIR": str(work / "gradio"), "GRADIO_ANALYTICS_ENABLED": "False",
                              "ENCODING_DATA": str(work / "data"), **env})  # no validation images: none offered
    log = open(work / "server.log", "w+")
    process = subprocess.Popen([sys.executable, "-m", "encoding.app", *argv, "--port", str(port)], cwd=str(work),
                               env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if process.poll() is not None:
                log.seek(0)
                pytest.fail(f"the app exited with status {process.returncode}:\n{log.read()[-3000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        break
            if time.monotonic() > deadline:
                pytest.fail(f"the app did not answer on {url} within {START_S} s")
            time.sleep(0.5)
        yield {"url": url, "process": process, "log": work / "server.log"}
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
        log.close()


@pytest.fixture(scope="module")
def server(tiny_folder, tmp_path_factory):
    """``python -m encoding.app --model FOLDER`` on a free port of 127.0.0.1; its URL. Killed at the end."""
    with serve_app(["--model", tiny_folder, "--device", "cpu"], tmp_path_factory.mktemp("app_server")) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    from gradio_client import Client

    return Client(server["url"], verbose=False)


def _segment(client, path, mode="whole", flip=False, window=None, stride=None, scales="0.75,1.0,1.25"):
    from gradio_client import handle_file

    return client.submit(handle_file(path), mode, flip, window, stride, scales,
                         api_name="/segment").result(timeout=REQUEST_S)


def _plan(client, request):
    return client.submit(request.model, request.backbone, request.dataset, request.nclass, request.crop_size,
                         request.batch_size, request.devices, request.memory_limit, request.reserve,
                         list(request.strategies), request.amp or "none", request.recompute or "none",
                         request.advise, request.aux, request.se_loss, request.timeline,
                         api_name="/plan").result(timeout=REQUEST_S)


# ------------------------------------------------------------------------------------------- through the server
@pytest.mark.parametrize("mode, flip, window, stride, keywords", [
    ("whole", False, None, None, dict(mode="whole")),
    ("slide", True, 24, 16, dict(mode="slide", flip=True, window=24, stride=16)),
    ("multi-scale", False, None, None, dict(mode="whole", scales=[0.5, 1.0]))])
def test_the_segment_tabs_mask_is_encoding_segments(client, tiny_folder, images, mode, flip, window, stride,
                                                   keywords):
    overlay, mask, legend, shares, mask_png = _segment(client, images["scene"], mode, flip, window, stride, "0.5, 1")
    expected = encoding.segment(encoding.load_model(tiny_folder), images["scene"], **keywords)
    saved = np.array(Image.open(mask_png))  # palettised: the pixel values are the class ids
    np.testing.assert_array_equal(saved, expected.numpy())
    counts = np.bincount(expected.numpy().reshape(-1))
    assert sorted(row[2] for row in shares["data"]) == sorted(int(n) for n in counts if n)
    assert sum(row[3] for row in shares["data"]) == pytest.approx(100.0, abs=0.05)
    classes = ModelInfo.of_dataset("shapes").classes
    assert {row[0] for row in shares["data"]} == {classes[c] for c in np.unique(expected.numpy())}
    assert Image.open(overlay).size == (61, 45) and Image.open(overlay).format == "JPEG"  # the legend is beside it
    assert np.array_equal(np.array(Image.open(mask)), saved)  # the mask shown is the file offered
    assert all(f"{row[0]} (" in legend for row in shares["data"])  # the classes present, beside the image


def test_the_plan_tabs_numbers_are_the_memory_tools(client, tmp_path):
    command, table, chart, recommended, advice, text, report_json, timeline, timeline_html = _plan(client, PLAN)
    assert timeline is None and timeline_html is None  # drawn only when asked for
    assert command == "python -m encoding.memory " + " ".join(plan_argv(PLAN))
    with contextlib.redirect_stdout(io.StringIO()) as printed, contextlib.redirect_stderr(io.StringIO()):
        expected = encoding.memory.main(plan_argv(PLAN) + ["--out-dir", str(tmp_path)])
    page = json.loads(open(report_json).read())
    assert page["strategies"] == expected["strategies"] and page["advice"] == expected["advice"]
    assert {k: v for k, v in page.items() if k != "advise_s"}.keys() == {k for k in expected if k != "advise_s"}
    assert text in printed.getvalue()  # the tool's own table, number for number
    header, rows = device_rows(expected)
    assert table["headers"] == header and table["data"] == rows
    assert advice["data"] == advice_rows(expected)[1]
    best = next(a for a in expected["advice"] if a["recommended"])
    assert f"{best['strategy']}, `--recompute {best['recompute']}`, batch {best['max_batch']}" in recommended
    assert Image.open(chart).format == "PNG"


@pytest.mark.parametrize("bad, message", [
    ("notes", "'notes.png' is not an image this page can read"),
    ("empty", "'empty.png' is not an image this page can read"),
    ("crop 0", "argument --crop-size: must be > 0, got 0"),
    ("unknown model", "--model no_such_net --backbone vgg_tiny: unknown segmentation model 'no_such_net'"),
    ("no strategy", "--strategies: unknown empty list"),
    ("scales", "scales: expected comma-separated numbers")])
def test_bad_input_gets_a_message_and_the_next_request_succeeds(client, server, images, bad, message):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as caught:
        if bad in images:
            _segment(client, images[bad])
        elif bad == "scales":
            _segment(client, images["scene"], "multi-scale", scales="half")
        else:
            changes = {"crop 0": dict(crop_size=0), "unknown model": dict(model="no_such_net"),
                       "no strategy": dict(strategies=())}[bad]
            _plan(client, PlanRequest(**{**PLAN.__dict__, **changes, "advise": False}))
    text = str(caught.value)
    assert message in text and "Traceback" not in text and len(text.splitlines()) == 1, text
    assert server["process"].poll() is None
    assert _segment(client, images["scene"])[4].endswith("_mask.png")  # still serving


def test_serving_writes_nothing_into_the_package(server):
    """A subclass of a Gradio component would make Gradio write a ``.pyi`` stub beside its module."""
    folder = os.path.join(ROOT, "encoding", "app")
    assert sorted(n for n in os.listdir(folder) if not n.endswith(".py") and n != "__pycache__") == []


# ------------------------------------------------------------------------------------------- in a real browser
def _browser():
    """``(chromium, chromedriver)`` of the system, or a reason to skip."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("no headless browser installed (apt-get install chromium chromium-driver; .ci/run does)")
    pytest.importorskip("selenium", reason="the browser test drives Chromium with selenium (the test extra)")
    return chromium, driver


def test_a_real_browser_uploads_an_image_and_sees_the_overlay(server, images, tmp_path):
    chromium, driver_path = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1100", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        browser.set_page_load_timeout(60)
        browser.get(server["url"])
        wait = WebDriverWait(browser, 60)
        upload = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#encoding-image input[type=file]"))
        upload.send_keys(images["scene"])
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "#encoding-image img"))
        browser.find_element(By.CSS_SELECTOR, "#encoding-segment").click()
        shown = wait.until(lambda b: [img for img in b.find_elements(By.CSS_SELECTOR, "#encoding-overlay img")
                                      if b.execute_script("return arguments[0].complete && "
                                                          "arguments[0].naturalWidth", img)])
        assert browser.execute_script("return arguments[0].naturalWidth", shown[0]) == 61
        legend = browser.find_element(By.CSS_SELECTOR, "#encoding-legend").text
        assert "background" in legend and "triangle" in legend
        present = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "#encoding-present-legend").text)
        assert " %)" in present  # the classes present, beside the image, in the page's text
        path = tmp_path / "app.png"
        browser.save_screenshot(str(path))
    finally:
        browser.quit()
    assert Image.open(path).format == "PNG" and Image.open(path).size[0] > 0
    if os.environ.get(SCREENSHOT_ENV):
        shutil.copyfile(path, os.environ[SCREENSHOT_ENV])


# ------------------------------------------------------------------------------------------- without a server
def test_segment_image_is_encoding_segment_with_legend_and_shares(tiny_folder, images):
    model = encoding.load_model(tiny_folder)
    result = segment_image(model, images["scene"], SegmentRequest(mode="slide", window=24, stride=16))
    assert torch.equal(result.labels, encoding.segment(model, images["scene"], mode="slide", window=24, stride=16))
    shares = class_shares(result.labels, model.info)
    assert sum(n for _, _, n, _ in shares) == 45 * 61 and sum(f for *_, f in shares) == pytest.approx(1.0)
    assert [n for _, _, n, _ in shares] == sorted((n for _, _, n, _ in shares), reverse=True)
    assert np.array(result.mask).tolist() == result.labels.tolist()
    image, ids = np.array(Image.open(images["scene"])).astype(int), result.labels.numpy()
    colours = np.array(model.info.palette)[ids]
    blended = (image * 128 + colours * 128 + 128) >> 8  # half the image, half the class colour, rounded
    background = (ids == 0)[..., None]  # 'background' shows the image as it is
    np.testing.assert_array_equal(result.overlay, np.where(background, image, blended))
    assert all(f"{name} (" in result.legend for name, *_ in shares)
    assert all(name in legend_html(model.info) for name in model.info.classes)
    with pytest.raises(UsageError, match="the image has no pixels"):
        segment_image(model, np.zeros((0, 4, 3), np.uint8))
    with pytest.raises(UsageError, match="no image"):
        segment_image(model, None)


def test_a_visitors_windows_and_scales_are_bounded_by_the_pixel_limit(tiny_folder, images):
    """A 45 x 61 image under --max-pixels 1,000,000: a 3000 px window, scale 60 (a 2400 x 1800 image) and stride 1
    made the server work far past the limit (memory, time); refused in one line before any work. Sensible
    requests still run."""
    from encoding.app.segmentation import MAX_SCALES
    from encoding.utils.images import ImageTooLarge, set_max_pixels

    set_max_pixels(1_000_000)
    model = encoding.load_model(tiny_folder)
    try:
        for request, error, message in [
                (SegmentRequest("multi-scale", window=3000, scales=(1.0,)), ImageTooLarge, "window 3000: image of"),
                (SegmentRequest("multi-scale", scales=(60.0,)), ImageTooLarge, "the image at scale 60: image of"),
                (SegmentRequest("slide", window=24, stride=5), UsageError, "stride 5: at least a quarter of"),
                (SegmentRequest("multi-scale", scales=(1.0,) * (MAX_SCALES + 1)), UsageError, "at most")]:
            with pytest.raises(error, match=message):
                segment_image(model, images["scene"], request)
        for request in (SegmentRequest("slide", window=24, stride=6), SegmentRequest("multi-scale", scales=(0.5, 2.0))):
            assert segment_image(model, images["scene"], request).labels.shape == (45, 61)
    finally:
        set_max_pixels(None)


def test_the_page_serves_the_example_images_not_their_folders(tmp_path):
    """The examples' folders were allowed: every file beside them (a dataset's training images, anything) was served
    on request. Only the example files themselves (and the page's own folder) are."""
    from encoding.app.cli import served_paths

    examples = [str(tmp_path / "JPEGImages" / name) for name in ("b.jpg", "a.jpg", "a.jpg")]
    assert served_paths("/work", examples) == ["/work", examples[1], examples[0]]


def test_the_examples_are_the_validation_images_already_on_disk(shapes_root, tmp_path):
    from conftest import tiny_shapes_pair

    _, val = tiny_shapes_pair(shapes_root)
    assert validation_images("shapes", root=str(shapes_root), limit=3, num_train=8, num_val=4) == val.images[:3]
    assert validation_images("shapes", root=str(tmp_path)) == [] and os.listdir(tmp_path) == []  # none generated
    assert validation_images("ade20k", root=str(tmp_path)) == [] and validation_images("no_such_data") == []


def test_parse_scales_and_segment_request_keywords():
    assert parse_scales("0.75, 1,1.25") == (0.75, 1.0, 1.25)
    for bad in ("", "a", "1,-1", "0", "1,inf", "nan"):  # inf: an OverflowError ("unexpected error") once segmenting
        with pytest.raises(UsageError, match="scales"):
            parse_scales(bad)
    assert SegmentRequest("multi-scale", True, scales=(1.0,)).keywords() == dict(mode="whole", scales=[1.0],
                                                                                  flip=True, window=None, stride=None)
    with pytest.raises(UsageError, match="unknown mode 'tiles'"):
        SegmentRequest("tiles").keywords()


def test_a_preset_stands_for_its_network_and_plan_memory_refuses_in_one_line(tmp_path):
    argv = plan_argv(PlanRequest(model="encnet_resnet50_ade", backbone="ignored", dataset="shapes"))
    assert argv[:6] == ["--model", "encnet", "--backbone", "resnet50", "--dataset", "ade20k"]
    assert "--aux" in argv and "--se-loss" in argv
    spec = plan_argv(PlanRequest(model="torchvision:deeplabv3_mobilenet_v3_large"))
    assert spec[:2] == ["--model", "torchvision:deeplabv3_mobilenet_v3_large"]
    with pytest.raises(UsageError, match=r"^argument --crop-size: must be > 0, got 0$"):
        plan_memory(PlanRequest(**{**PLAN.__dict__, "crop_size": 0}), str(tmp_path))
    with pytest.raises(UsageError, match="memory limit: memory size '12' has no unit"):
        plan_memory(PlanRequest(**{**PLAN.__dict__, "memory_limit": "12"}), str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_the_plan_reports_the_tools_progress_line_by_line(tmp_path):
    lines = []
    result = plan_memory(PlanRequest(**{**PLAN.__dict__, "advise": False}), str(tmp_path), progress=lines.append)
    assert [line.split(":")[0] for line in lines] == ["gather", "ddp"]  # one line per strategy, as it is simulated
    assert all(" simulated in " in line for line in lines)
    assert sorted(os.listdir(tmp_path)) == ["memory_balance.json", "memory_balance.png"]
    assert json.loads((tmp_path / "memory_balance.json").read_text())["strategies"] == result.report["strategies"]


def test_the_plan_draws_the_memory_tools_timeline_of_the_same_step(tmp_path):
    result = plan_memory(PlanRequest(**{**PLAN.__dict__, "advise": False, "timeline": True}), str(tmp_path))
    data = json.loads((tmp_path / "timeline" / "timeline.json").read_text())
    for name, entry in result.report["strategies"].items():  # the report's simulation, device for device
        assert [round(p / 2 ** 20, 2) for p in data["strategies"][name]["peak_bytes"]] == entry["peak_mib"]
    assert Image.open(result.timeline_png).format == "PNG"
    assert result.timeline_html.endswith("timeline.html") and os.path.getsize(result.timeline_html) > 0
    assert result.command.endswith("--timeline timeline")


def test_the_command_line_binds_localhost_and_refuses_bad_options_in_one_line(tmp_path, capsys):
    from encoding.app.cli import cli, parse_args

    args = parse_args(["--model", "fcn_resnet50_voc"])
    assert (args.host, args.port, args.model_source, args.resume) == ("127.0.0.1", 7860, "fcn_resnet50_voc", None)

    for argv, message in [(["--resume", "a.pth", "--model", "b"], "not both"),
                          (["--resume", str(tmp_path / "none.pth")], "no such checkpoint file"),
                          (["--port", "70000"], "expected a TCP port from 1 to 65535")]:
        with pytest.raises(SystemExit) as exit_:
            cli(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def test_import_encoding_loads_neither_the_app_nor_gradio():
    code = "import sys, encoding; print(' '.join(m for m in sys.modules if m.startswith(('encoding', 'gradio'))))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=ROOT)).stdout.split()
    assert "encoding.memory" in loaded
    assert not [m for m in loaded if m.startswith(("encoding.app", "gradio"))]


def test_a_folder_dataset_is_planned_with_its_classes(tmp_path):
    """PlanRequest(dataset="folder", data_root=D): the class count comes from D's classes (issue 44)."""
    from folder_data import make_folder

    data = make_folder(str(tmp_path / "data"), classes="classes: [bg, red, blue, green, black]\n")
    request = PlanRequest(model="fcn", backbone="vgg_tiny", dataset="folder", data_root=data, crop_size=32,
                          devices=2, batch_size=2)
    argv = plan_argv(request)
    assert argv[argv.index("--data-root") + 1] == data
    result = plan_memory(request, str(tmp_path / "out"))
    assert result.report["config"]["nclass"] == 5
