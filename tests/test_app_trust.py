"""The web page is a server: it runs no code a request names (nor an uploaded ``.py``), checks an image's size from its
header before decoding it, bounds its queue and the plans it simulates, and keeps serving after each refusal."""
import functools
import os
import struct
import sys
import time
import zlib

import numpy as np
import pytest

from test_app import PLAN, REQUEST_S, _plan, _segment, images, serve_app, tiny_folder  # noqa: F401 (fixtures)

from encoding.app.planning import PlanLimits, PlanRequest, check_request, plan_argv, plan_memory
from encoding.errors import UsageError
from encoding.models.external import UntrustedCode
from encoding.utils.images import ImageTooLarge

#: The module a request must never import: importing it, or calling its factory, writes the marker file.
PAYLOAD = '''import os
open(os.environ["ENCODING_TEST_MARKER"], "a").write("imported\\n")


def build(num_classes=21, **kwargs):
    open(os.environ["ENCODING_TEST_MARKER"], "a").write("called\\n")
    raise SystemExit("payload ran")
'''
MIB = 2 ** 20


def _payload(folder):
    """``folder/payload_mod.py`` and the marker path it writes."""
    (folder / "payload_mod.py").write_text(PAYLOAD)
    return folder / "marker.txt"


@functools.lru_cache(maxsize=None)
def _huge_png_bytes(side):
    """The bytes of :func:`_huge_png`, deflated once per side (0.8 s at 12000) for the tests that write one."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(9), b"\x00" + b"\x80" * side
    idat = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def _huge_png(path, side=12000):
    """A ``side x side`` grey PNG of one flat colour (about 150 KB), written without holding its pixels."""
    path.write_bytes(_huge_png_bytes(side))
    return str(path)


def _memory_kib(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture(scope="module")
def guarded(tiny_folder, tmp_path_factory):  # noqa: F811 (the fixture imported above)
    """The page serving the tiny network with a payload module importable (on PYTHONPATH), Gradio's uploads in a
    folder under its working directory (importable as a package from there), a queue of 2 at a time + 4 waiting."""
    work, code = tmp_path_factory.mktemp("app_guarded"), tmp_path_factory.mktemp("app_payload")
    marker = _payload(code)
    env = dict(PYTHONPATH=os.pathsep.join([str(code), os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                           os.environ.get("PYTHONPATH", "")]),
               GRADIO_TEMP_DIR=str(work / "uploads"), ENCODING_TEST_MARKER=str(marker))
    argv = ["--model", tiny_folder, "--device", "cpu", "--concurrency-limit", "2", "--max-queue", "4"]
    with serve_app(argv, work, **env) as running:
        from gradio_client import Client

        yield dict(running, work=work, marker=marker, client=Client(running["url"], verbose=False))


def _refused(call):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as caught:
        call()
    text = str(caught.value)
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    return text


# ------------------------------------------------------------------------------------------- no code runs
def test_a_request_naming_module_code_is_refused_and_imports_nothing(guarded):
    for model in ("payload_mod:build", "os:getcwd"):
        text = _refused(lambda: _plan(guarded["client"], PlanRequest(**{**PLAN.__dict__, "model": model})))
        assert f"model {model!r} names code to import" in text and "--plan-model" in text
    assert not guarded["marker"].exists()  # neither imported nor called
    still = PlanRequest(**{**PLAN.__dict__, "advise": False})  # a plan without the advice's search: answered
    assert _plan(guarded["client"], still)[0].startswith("python -m encoding.memory")  # still serving


def test_an_uploaded_python_file_never_becomes_code(guarded):
    import httpx

    evil = guarded["work"].parent / "evil.py"
    evil.write_text(PAYLOAD)
    answer = httpx.post(guarded["url"] + "gradio_api/upload", files={"files": ("evil.py", evil.read_bytes())},
                        timeout=60)
    stored = os.path.relpath(answer.json()[0], guarded["work"])  # the server says where it keeps the upload
    assert stored.startswith("uploads") and stored.endswith("evil.py")
    module = os.path.splitext(stored)[0].replace(os.sep, ".")  # importable from the server's working directory
    text = _refused(lambda: _plan(guarded["client"], PlanRequest(**{**PLAN.__dict__, "model": f"{module}:build"})))
    assert "names code to import" in text
    assert "not an image" in _refused(lambda: _segment(guarded["client"], str(evil)))  # as an image: refused
    assert not guarded["marker"].exists()


def test_check_request_refuses_code_in_process_and_imports_nothing(tmp_path, monkeypatch):
    marker = _payload(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ENCODING_TEST_MARKER", str(marker))
    request = PlanRequest(**{**PLAN.__dict__, "model": "payload_mod:build"})
    with pytest.raises(UntrustedCode, match=r"^model 'payload_mod:build' names code to import \(payload_mod\)"):
        plan_memory(request, str(tmp_path / "out"))
    assert not marker.exists() and "payload_mod" not in sys.modules and not (tmp_path / "out").exists()
    from encoding.app import planning

    monkeypatch.setattr(planning, "check_request", lambda *args: None)  # past the page's check: the import gate
    with pytest.raises(UsageError, match="payload_mod.*trust"):
        plan_memory(request, str(tmp_path / "out"))
    assert not marker.exists() and "payload_mod" not in sys.modules
    for allowed in ("fcn", "fcn_resnet50_voc", "torchvision:fcn_resnet50"):
        check_request(PlanRequest(model=allowed))  # registry, presets and the built-in architectures
    # a folder of the server (transformers:PATH) is read only where the starter named it: a visitor's request for
    # one would read its weights, or tell whether a path exists
    with pytest.raises(UsageError, match=r"^model 'transformers:/etc' names a folder of this server: this page reads "
                                         r"no folder a request names"):
        check_request(PlanRequest(model="transformers:/etc"))
    check_request(PlanRequest(model="transformers:/srv/net"), PlanLimits(trusted=("transformers:/srv/net",)))
    # the starter's --plan-model: that network, and no other
    check_request(request, PlanLimits(trusted=("payload_mod:build",), only="payload_mod:build"))
    with pytest.raises(UsageError, match=r"this page plans payload_mod:build only \(its --plan-model\)"):
        check_request(PlanRequest(model="fcn"), PlanLimits(trusted=("payload_mod:build",), only="payload_mod:build"))


# ------------------------------------------------------------------------------------------- sizes from headers
def test_a_huge_image_is_refused_from_its_header_and_the_server_keeps_serving(guarded, images):  # noqa: F811
    path = _huge_png(guarded["work"].parent / "huge.png")
    assert os.path.getsize(path) < 1024 * 1024  # 144 megapixels in a small file
    pid = guarded["process"].pid
    _segment(guarded["client"], images["scene"])  # warm: the first request's own allocations
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")  # the server's peak resident memory starts again from now
    before = _memory_kib(pid, "VmRSS")
    text = _refused(lambda: _segment(guarded["client"], path))
    assert "'huge.png': image of 12000 x 12000 = 144,000,000 pixels is over the limit of 100,000,000" in text
    assert "checked before decoding" in text and str(guarded["work"]) not in text  # no server folder shown
    growth = (_memory_kib(pid, "VmHWM") - before) / 1024
    print(f"the server's peak memory grew by {growth:.1f} MiB refusing a 12000 x 12000 PNG")
    assert growth < 300, f"the server grew by {growth:.0f} MiB on a refused image"  # decoded: 144 MiB grey, 432 RGB
    assert guarded["process"].poll() is None
    assert _segment(guarded["client"], images["scene"])[4].endswith("_mask.png")


def test_segment_image_refuses_from_the_header_in_process(tiny_folder, tmp_path, monkeypatch):  # noqa: F811
    import encoding
    from encoding.app import segmentation
    from encoding.utils.images import set_max_pixels

    model = encoding.load_model(tiny_folder)
    path = _huge_png(tmp_path / "huge.png", side=2000)
    monkeypatch.setattr(segmentation, "read_rgb", lambda p: pytest.fail(f"{p} was decoded"))
    set_max_pixels(1000)
    try:
        with pytest.raises(ImageTooLarge, match=r"^'huge.png': image of 2000 x 2000 = 4,000,000 pixels is over the "
                                                r"limit of 1,000 pixels \(checked before decoding"):
            segmentation.segment_image(model, path)
        with pytest.raises(ImageTooLarge, match="^the image: image of 40 x 30 = 1,200 pixels"):
            segmentation.segment_image(model, np.zeros((30, 40, 3), np.uint8))  # an array: the same limit
    finally:
        set_max_pixels(None)


# ------------------------------------------------------------------------------------------- bounded work
def test_twenty_concurrent_requests_are_each_answered_or_refused_with_a_message(guarded, images):  # noqa: F811
    from gradio_client import handle_file
    from gradio_client.exceptions import AppError
    from gradio_client.utils import QueueError

    client = guarded["client"]
    jobs = [client.submit(handle_file(images["scene"]), "whole", False, None, None, "1", api_name="/segment")
            for _ in range(20)]
    answered, refused = 0, []
    for job in jobs:
        try:
            answered += job.result(timeout=REQUEST_S)[4].endswith("_mask.png")
        except (AppError, QueueError) as err:  # the queue's refusal ("Queue is full! Please try again.")
            refused.append(str(err))
    print(f"20 concurrent requests: {answered} answered, {len(refused)} refused: {sorted(set(refused))}")
    assert answered + len(refused) == 20 and answered >= 1
    assert all(text.strip() and "Traceback" not in text for text in refused), refused
    assert guarded["process"].poll() is None and _segment(client, images["scene"])[4].endswith("_mask.png")


@pytest.mark.parametrize("change, message", [
    (dict(devices=100000), "devices: this page simulates at most 256 devices, got 100000"),
    (dict(memory_limit="-5GiB"), "memory limit: memory size '-5GiB' must be positive"),
    (dict(memory_limit="99999999TiB"), "memory limit: no real device has 99999999TiB of memory"),
    (dict(reserve="-1GiB"), "reserve: memory size '-1GiB' must be positive")])
def test_absurd_plans_are_refused_in_one_line_at_once(guarded, change, message):
    started = time.monotonic()
    text = _refused(lambda: _plan(guarded["client"], PlanRequest(**{**PLAN.__dict__, **change})))
    assert message in text and "expected one argument" not in text
    assert time.monotonic() - started < 30  # nothing simulated


def test_a_value_starting_with_a_dash_reaches_the_tool_as_a_value():
    argv = plan_argv(PlanRequest(model="fcn", memory_limit="-5GiB", backbone="-x"))
    assert "--memory-limit=-5GiB" in argv and "--backbone=-x" in argv


def test_the_plan_tab_starts_on_the_served_network(guarded):
    from encoding.datasets import datasets

    config = guarded["client"].view_api(return_format="dict", print_info=False)
    parameters = {p["parameter_name"]: p["parameter_default"]
                  for p in config["named_endpoints"]["/plan"]["parameters"]}
    assert (parameters["model"], parameters["backbone"], parameters["dataset"]) == ("fcn", "vgg_tiny", "shapes")
    assert (parameters["nclass"], parameters["crop_size"]) == (datasets["shapes"].NUM_CLASS, 32)


# ------------------------------------------------------------------------------------------- the command line
def test_a_missing_model_is_a_usage_error_exit_2(tmp_path, capsys):
    from encoding.app.cli import cli

    assert cli(["--model", str(tmp_path / "no_such_folder")]) == 2  # as the module's docstring says
    err = capsys.readouterr().err.strip()
    assert "no_such_folder" in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("argv, trusted", [([], False), (["--trust-code"], True)])
def test_trust_code_is_handed_to_load_model(monkeypatch, tmp_path, argv, trusted):
    from encoding.app.cli import load_network, parse_args
    from encoding.inference import loading

    calls = []

    def load_model(source, *, device=None, weights=None, trust_code=False, **options):
        calls.append((source, trust_code))
        return "network"

    monkeypatch.setattr(loading, "load_model", load_model)
    assert load_network(parse_args(["--model", str(tmp_path), "--device", "cpu", *argv])) == "network"
    assert calls == [(str(tmp_path), trusted)]


NETWORK = '''import os
from torch import nn
open(os.environ["ENCODING_TEST_MARKER"], "a").write("imported\\n")


def build(num_classes=21, **kwargs):
    return nn.Conv2d(3, num_classes, 1)
'''


def test_a_model_folder_naming_code_needs_trust_code(tmp_path, monkeypatch, capsys):
    from encoding.app.cli import cli, load_network, parse_args, plan_limits
    from encoding.inference import ModelInfo, save_pretrained
    from encoding.models import get_segmentation_model

    (tmp_path / "payload_net.py").write_text(NETWORK)
    marker = tmp_path / "marker.txt"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ENCODING_TEST_MARKER", str(marker))
    network = get_segmentation_model("payload_net:build", dataset="shapes").eval()
    network.info = ModelInfo.of_dataset("shapes", model="payload_net:build")
    folder = save_pretrained(network, tmp_path / "shared")
    marker.unlink()
    monkeypatch.delitem(sys.modules, "payload_net")

    assert cli(["--model", str(folder), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "payload_net" in err and "--trust-code" in err and len(err.splitlines()) == 1, err
    assert not marker.exists() and "payload_net" not in sys.modules  # refused before anything was imported

    args = parse_args(["--model", str(folder), "--device", "cpu", "--trust-code"])
    model = load_network(args)
    assert marker.read_text() == "imported\n"  # opted in: the folder's code ran
    assert plan_limits(args, model) == PlanLimits(trusted=("payload_net:build",), max_devices=256, max_work=8000)


def test_plan_limits_trust_only_what_the_starter_named():
    from encoding.app.cli import parse_args, plan_limits

    assert plan_limits(parse_args([]), None) == PlanLimits(max_devices=256, max_work=8000)
    limits = plan_limits(parse_args(["--plan-model", "my_models.tiny:build", "--max-devices", "8",
                                     "--max-plan-work", "50"]), None)
    assert limits == PlanLimits(trusted=("my_models.tiny:build",), only="my_models.tiny:build", max_devices=8,
                                max_work=50)


def test_plan_limits_let_the_page_read_the_folder_it_serves_and_no_other():
    from encoding.app.cli import parse_args, plan_limits

    limits = plan_limits(parse_args(["--plan-model", "transformers:/srv/net"]), None)
    assert limits.trusted == ("transformers:/srv/net",)
    with pytest.raises(UsageError, match="this page plans transformers:/srv/net only"):
        check_request(PlanRequest(model="transformers:/srv/other"), limits)


def test_icons_and_other_formats_that_decode_when_opened_are_refused_unopened(tmp_path):
    """Pillow decodes an ICO's embedded PNG while opening it, before its size can be checked (a 400 KB icon held a
    12000 x 12000 PNG: 550 MiB decoded before the refusal). Only formats whose header gives the size are opened;
    the folders' and the demo's image lists skip the others."""
    from PIL import Image, UnidentifiedImageError

    from encoding.inference.demo import expand_images
    from encoding.utils.images import image_extensions, open_image

    icon = tmp_path / "a.ico"
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(icon)
    with pytest.raises(UnidentifiedImageError, match=r"a\.ico: not an image of a format read here \(PNG, JPEG"):
        with open_image(icon):
            pytest.fail("an icon was opened")
    assert ".ico" not in image_extensions() and ".icns" not in image_extensions() and ".eps" not in image_extensions()
    assert {".png", ".jpg", ".jpeg", ".tif", ".webp", ".bmp"} <= image_extensions()
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "b.png")
    assert [os.path.basename(p) for p in expand_images([str(tmp_path)])] == ["b.png"]


def test_an_inline_image_is_written_as_it_is_and_checked_like_an_upload(tmp_path, monkeypatch):
    import base64

    import gradio as gr
    from gradio.data_classes import ImageData

    from encoding.app.segment_tab import image_input
    from encoding.app.segmentation import check_image_size

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))  # Gradio's upload folder: the upload below is in it
    raw = open(_huge_png(tmp_path / "huge.png"), "rb").read()
    with gr.Blocks():
        image = image_input(str(tmp_path / "work"), label="image")
    (tmp_path / "work").mkdir()
    path = image.preprocess(ImageData(url="data:image/png;base64," + base64.b64encode(raw).decode()))
    assert open(path, "rb").read() == raw  # the bytes as sent: Gradio decoded nothing
    with pytest.raises(ImageTooLarge, match="^'inline-image': image of 12000 x 12000"):
        check_image_size(path)
    uploaded = image.preprocess(ImageData(path=str(tmp_path / "huge.png"), orig_name="huge.png"))
    assert uploaded == str(tmp_path / "huge.png") and image.preprocess(None) is None


def test_an_image_path_outside_the_upload_folder_is_refused_not_read(tmp_path, monkeypatch):
    """A request names the image by path; without Gradio's ``meta`` marker Gradio does not check it, and the page read
    any server file named there and served its overlay back (and told whether the path existed)."""
    import gradio as gr
    from gradio.data_classes import ImageData
    from PIL import Image

    from encoding.app.segment_tab import image_input

    uploads, elsewhere = tmp_path / "uploads", tmp_path / "server"
    uploads.mkdir()
    elsewhere.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))
    for folder in (uploads, elsewhere):
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "photo.png")
    example = elsewhere / "example.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(example)
    (uploads / "link.png").symlink_to(elsewhere / "photo.png")
    with gr.Blocks():
        image = image_input(str(tmp_path / "work"), [str(example)], label="image")
    assert image.preprocess(ImageData(path=str(uploads / "photo.png"))) == str(uploads / "photo.png")
    assert image.preprocess(ImageData(path=str(example))) == str(example)  # one of the page's examples
    for path in (elsewhere / "photo.png", "/etc/passwd", tmp_path / "no_such_file", uploads / "link.png",
                 uploads / ".." / "server" / "photo.png"):
        with pytest.raises(gr.Error, match="not a file uploaded to this page") as err:
            image.preprocess(ImageData(path=str(path)))
        assert str(tmp_path) not in str(err.value) and "passwd" not in str(err.value)


@pytest.mark.parametrize("encode", ["base64", "percent"])
def test_an_inline_image_over_the_upload_limit_is_refused_before_it_is_decoded(tmp_path, monkeypatch, encode):
    """An inline image is held to an upload's byte limit (8 bytes a pixel of --max-pixels), from the URL's length:
    refused with the page's message, nothing decoded or written; one of the limit's size is taken."""
    import base64
    from urllib.parse import quote_from_bytes

    import gradio as gr
    from gradio.data_classes import ImageData

    from encoding.app import segment_tab
    from encoding.app.segmentation import upload_limit
    from encoding.utils import images as image_limits

    def url(raw):
        if encode == "base64":
            return "data:image/png;base64," + base64.b64encode(raw).decode()
        return "data:image/png," + quote_from_bytes(raw, safe="")

    monkeypatch.setattr(image_limits, "_limit", 100)  # the server's --max-pixels 100
    assert upload_limit() == 800
    work = tmp_path / "work"
    work.mkdir()
    decoded = []
    b64decode = base64.b64decode
    monkeypatch.setattr(base64, "b64decode", lambda *a, **k: decoded.append(1) or b64decode(*a, **k))
    with gr.Blocks():
        image = segment_tab.image_input(str(work), label="image")
    with pytest.raises(gr.Error, match=r"the inline image holds about 801 bytes, over the page's limit of 800 bytes "
                                       r"\(8 a pixel of --max-pixels 100\)"):
        image.preprocess(ImageData(url=url(bytes(801))))
    assert not decoded and not os.listdir(work)
    raw = bytes(range(200)) * 4 if encode == "base64" else b"a" * 800
    assert open(image.preprocess(ImageData(url=url(raw))), "rb").read() == raw


def test_the_page_plans_the_starters_network_and_refuses_a_bad_one_when_built(tmp_path, monkeypatch):
    from encoding.app.page import build_page

    (tmp_path / "payload_net.py").write_text(NETWORK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ENCODING_TEST_MARKER", str(tmp_path / "marker.txt"))
    page = build_page(None, str(tmp_path), (), PlanLimits(("payload_net:build",), "payload_net:build"))
    boxes = [c for c in page.blocks.values() if getattr(c, "elem_id", None) == "plan-model"]
    assert [(b.value, b.choices, b.interactive) for b in boxes] == [
        ("payload_net:build", [("payload_net:build", "payload_net:build")], False)]
    with pytest.raises(UsageError, match="no_such_module"):
        build_page(None, str(tmp_path), (), PlanLimits(("no_such_module:build",), "no_such_module:build"))
    from encoding.memory.cli import parse_args

    plain = [c.value for c in build_page(None, str(tmp_path)).blocks.values()
             if getattr(c, "elem_id", None) in ("plan-model", "plan-limit", "plan-reserve")]
    tool = parse_args(["--advise"])  # no network served: the memory tool's own defaults, not restated
    assert plain == [tool.model, tool.memory_limit, tool.reserve]


def test_an_image_url_is_refused_before_gradio_downloads_it(tiny_folder, tmp_path, monkeypatch):  # noqa: F811
    """A request naming its image by an ``https://`` URL (with Gradio's ``meta`` marker): Gradio downloaded it into
    its cache before the handler ran, past its upload limit and holding the whole answer in memory (400 MiB raised
    the server's peak by 800 MiB), and the page segmented what it fetched. Refused before any download; an upload
    still goes through."""
    import asyncio

    import gradio as gr
    from gradio import processing_utils
    from PIL import Image

    import encoding
    from encoding.app.page import build_page

    uploads = tmp_path / "uploads"
    uploads.mkdir()
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(uploads / "photo.png")
    fetched = []

    async def download(url, cache_dir):  # Gradio's fetch of a URL, recorded instead of made
        fetched.append(url)
        return str(uploads / "photo.png")

    monkeypatch.setattr(processing_utils, "async_ssrf_protected_download", download)
    (tmp_path / "work").mkdir()
    page = build_page(encoding.load_model(tiny_folder), str(tmp_path / "work"))
    segment = next(fn for fn in page.fns.values() if fn.api_name == "segment")
    meta = {"_type": "gradio.FileData"}
    options = ["whole", False, None, None, "1"]
    for url in ("https://example.com/huge.png", "http://example.com/a.png"):
        with pytest.raises(gr.Error, match=r"the image is a URL: this page fetches nothing") as err:
            asyncio.run(page.preprocess_data(segment, [{"path": url, "meta": meta}, *options], None))
        assert "example.com" not in str(err.value)
    assert fetched == []
    upload = asyncio.run(page.preprocess_data(segment, [{"path": str(uploads / "photo.png"), "meta": meta},
                                                        *options], None))
    assert upload[0] == str(uploads / "photo.png")


def test_a_gradio_without_the_download_step_the_page_guards_is_refused(tmp_path, monkeypatch):
    """The URL guard replaces one Gradio method; a Gradio without it would serve request URLs unguarded: refused."""
    import gradio as gr

    from encoding.app.segment_tab import image_input
    from encoding.errors import MissingDependency

    monkeypatch.delattr(gr.blocks.Block, "async_move_resource_to_block_cache")
    with gr.Blocks(), pytest.raises(MissingDependency, match="async_move_resource_to_block_cache"):
        image_input(str(tmp_path), label="image")
