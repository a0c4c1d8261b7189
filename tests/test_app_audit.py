"""The web page's audit (the Segment and Plan memory tabs' handlers, in process): concurrent plans keep to their own
progress and leave the process's streams alone; a visitor's tiny windows, a plan's work and the files of each
request are bounded before or after the work; SIGTERM stops the page and removes its working folder."""
import base64
import io
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
from PIL import Image

import test_app
from test_app import PLAN

from encoding.app.planning import PlanRequest, plan_memory
from encoding.errors import UsageError

images, tiny_folder = test_app.images, test_app.tiny_folder  # the page's tests' fixtures
WAIT_S = 60  # the longest a forced interleaving waits for the other thread (a loaded machine)


# ------------------------------------------------------------------------------------------- bug 1: the streams
def test_concurrent_plans_each_see_their_own_progress_and_leave_sys_stderr_alone(tmp_path, monkeypatch):
    """Two plans in two threads (``--concurrency-limit 2``), interleaved by events: A enters, B enters, A ends while
    B runs, then B ends. ``contextlib.redirect_stderr`` swapped the process's stream: A's second line went to B's
    progress, a server log line written meanwhile to a visitor's, and afterwards ``sys.stderr`` stayed A's stream."""
    real = io.StringIO()
    monkeypatch.setattr(sys, "stderr", real)  # the server's log
    a_lines, b_lines, errors = [], [], []
    a_in, b_in, a_done = (threading.Event() for _ in range(3))

    def a_progress(line):
        a_lines.append(line)
        if len(a_lines) == 1:
            a_in.set()
            assert b_in.wait(WAIT_S), "B never reached its first line"

    def b_progress(line):
        b_lines.append(line)
        if len(b_lines) == 1:
            b_in.set()
            assert a_done.wait(WAIT_S), "A never ended"

    def plan(name, strategies, progress, done=None):
        try:
            request = PlanRequest(**{**PLAN.__dict__, "advise": False, "strategies": strategies})
            plan_memory(request, str(tmp_path / name), progress=progress)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(f"{name}: {type(err).__name__}: {err}")
        finally:
            if done is not None:
                done.set()

    a = threading.Thread(target=plan, args=("a", ("gather", "ddp"), a_progress, a_done))
    b = threading.Thread(target=plan, args=("b", ("balanced", "zero1"), b_progress))
    a.start()
    assert a_in.wait(WAIT_S)
    print("a server log line while A plans", file=sys.stderr)  # another thread's (Gradio's, a traceback)
    b.start()
    a.join(WAIT_S)
    b.join(WAIT_S)
    assert not errors, errors
    assert [line.split(":")[0] for line in a_lines] == ["gather", "ddp"], a_lines
    assert [line.split(":")[0] for line in b_lines] == ["balanced", "zero1"], b_lines
    print("a server log line after both plans", file=sys.stderr)
    sys.stderr.flush()
    assert real.getvalue().splitlines() == ["a server log line while A plans", "a server log line after both plans"]
    assert getattr(sys.stderr, "real", sys.stderr) is real


def test_a_plan_refused_by_the_tools_parser_keeps_its_message_and_prints_nothing(tmp_path, monkeypatch, capfd):
    from encoding.app import streams

    with pytest.raises(UsageError, match=r"^argument --crop-size: must be > 0, got 0$"):
        plan_memory(PlanRequest(**{**PLAN.__dict__, "crop_size": 0}), str(tmp_path))
    out, err = capfd.readouterr()
    assert "crop-size" not in out + err  # caught for the page, not printed to the server's log
    caught = io.StringIO()
    with streams.routed(stderr=caught):
        print("mine", file=sys.stderr)
    print("the log's", file=sys.stderr)
    assert caught.getvalue() == "mine\n" and "the log's" in capfd.readouterr().err


# ------------------------------------------------------------------------------------------- bug 2: tiny windows
def test_a_window_under_half_the_training_crop_is_refused_before_any_work(tiny_folder, images, monkeypatch,
                                                                           tmp_path):
    """Windows of 2 pixels (stride 1) passed the stride rule and took 49 times a whole-image pass (2 x 2 windows of
    a 400 x 400 image); a window under half the training crop (32: 16) is refused in one line, before any work (the
    image is not even read)."""
    import gradio as gr

    import encoding
    from encoding.app import segmentation
    from encoding.app.segment_tab import segment_handler
    from encoding.app.segmentation import SegmentRequest, segment_image

    model = encoding.load_model(tiny_folder)
    assert model.info.crop_size == 32
    segment, read_rgb = segmentation.segment, segmentation.read_rgb
    monkeypatch.setattr(segmentation, "segment", lambda *a, **k: pytest.fail("segmented a refused request"))
    monkeypatch.setattr(segmentation, "read_rgb", lambda *a: pytest.fail("read the image of a refused request"))
    for request in (SegmentRequest("slide", window=2), SegmentRequest("slide", window=15, stride=15),
                    SegmentRequest("multi-scale", window=8, scales=(1.0,))):
        with pytest.raises(UsageError, match=rf"^window {request.window}: at least 16 pixels for this network "
                                             r"\(half its training crop 32\)$"):
            segment_image(model, images["scene"], request)
    handler = segment_handler(model, _workdir(monkeypatch, tmp_path))
    with pytest.raises(gr.Error, match="window 2: at least 16 pixels"):
        handler(images["scene"], "slide", False, 2, None, "1")
    for value in (float("inf"), float("nan"), "inf", "sixteen", -16, 16.5):  # a request, not the number field
        with pytest.raises(gr.Error, match=r"window: expected a positive whole number of pixels \(or 0: the default\), got "):
            handler(images["scene"], "slide", False, value, None, "1")
    # mode whole: a request's windows were dropped without a word; the form's (labelled "slide / multi-scale") unread
    with pytest.raises(UsageError, match="^window / stride: options of mode slide / multi-scale, not of mode whole$"):
        segment_image(model, images["scene"], SegmentRequest("whole", window=5, stride=1))
    monkeypatch.setattr(segmentation, "segment", segment)
    monkeypatch.setattr(segmentation, "read_rgb", read_rgb)
    for request in (SegmentRequest("slide", window=16, stride=4), SegmentRequest("slide"),
                    SegmentRequest("multi-scale", window=16, scales=(0.5,))):
        assert segment_image(model, images["scene"], request).labels.shape == (45, 61)
    assert handler(images["scene"], "whole", False, 2, 1, "1")[2]  # the form's windows are not whole mode's
    from dataclasses import replace

    assert segmentation.min_window(model.info) == 16
    assert segmentation.min_window(replace(model.info, crop_size=None)) == segmentation.MIN_WINDOW  # no crop known


# ------------------------------------------------------------------------------------------- bug 3: a plan's work
ALL_STRATEGIES = ("gather", "balanced", "balanced-auto", "ddp", "fsdp", "zero1")


def test_a_plan_over_the_pages_work_is_refused_before_any_simulation(tmp_path, monkeypatch):
    """A large preset over 256 devices, the six strategies, recompute all, advice and timeline held the compute slot
    for 13+ minutes: only the device count was bounded. Its work (modules x strategies x passes) is refused in one
    line, before the memory tool simulates anything (nor writes anything)."""
    import gradio as gr

    from encoding.app.plan_tab import plan_handler
    from encoding.memory import report

    monkeypatch.setattr(report, "memory_report", lambda *a, **k: pytest.fail("simulated a refused plan"))
    heavy = PlanRequest(model="encnet_resnest269_ade", devices=256, strategies=ALL_STRATEGIES, recompute="all",
                        advise=True, timeline=True)
    started = time.monotonic()
    with pytest.raises(UsageError, match=r"^this plan's work, 1841 modules x 6 strategies x 6 passes = 66,276, is "
                                         r"over this page's 8,000: plan fewer strategies, without recompute, "
                                         r"advise or timeline, or a smaller network"):
        plan_memory(heavy, str(tmp_path / "out"))
    assert time.monotonic() - started < 30 and [p for p in tmp_path.rglob("*") if p.is_file()] == []
    work = _workdir(monkeypatch, tmp_path)
    plan = plan_handler(work)
    with pytest.raises(gr.Error, match="this plan's work"):
        plan(heavy.model, None, None, None, None, None, 256, "11GiB", "0B", list(ALL_STRATEGIES), "none", "all",
             True, timeline=True, progress=lambda *a, **k: None)
    assert os.listdir(work) == []


def test_the_work_of_a_plan_counts_modules_strategies_and_passes(tmp_path, monkeypatch):
    from encoding.app.planning import PLAN_WORK, PlanLimits, _parse, plan_argv, plan_passes, plan_work

    tiny = _parse(plan_argv(PLAN))  # fcn / vgg_tiny: 44 modules, 2 strategies, the table and the advice
    assert plan_passes(tiny) == 2 and plan_work(tiny) == (44, 176)
    everything = _parse(plan_argv(PlanRequest(model="fcn_resnet50_voc", devices=256, strategies=ALL_STRATEGIES,
                                              recompute="all", advise=True, timeline=True), str(tmp_path)))
    assert plan_passes(everything) == 6 and plan_work(everything) == (162, 5832) and 5832 <= PLAN_WORK
    from encoding.memory import report

    monkeypatch.setattr(report, "memory_report", lambda *a, **k: pytest.fail("simulated a refused plan"))
    with pytest.raises(UsageError, match=r"= 176, is over this page's 100"):
        plan_memory(PLAN, str(tmp_path / "out"), limits=PlanLimits(max_work=100))  # the Python API's own bound


# ------------------------------------------------------------------------------------------- bug 4: the files
def _workdir(monkeypatch, tmp_path, clock=None, **options):
    """A fresh working folder (in ``tmp_path``) whose :class:`WorkFolders` runs on ``clock`` (a list holding the
    time)."""
    from encoding.app import workfiles

    folder = str(tmp_path / "work")
    os.mkdir(folder)
    monkeypatch.setitem(workfiles._SHARED, os.path.realpath(folder),
                        workfiles.WorkFolders(folder, clock=(lambda: clock[0]) if clock else time.monotonic,
                                              **options))
    return folder


def _inline(image_path=None, raw=None):
    from gradio.data_classes import ImageData

    raw = open(image_path, "rb").read() if image_path else raw
    return ImageData(url="data:image/png;base64," + base64.b64encode(raw).decode())


def test_an_inline_image_is_removed_once_the_handler_is_done_with_it(tiny_folder, images, monkeypatch, tmp_path):
    """Each image sent inline stayed in the working folder (refused ones too: up to 8 bytes a pixel of
    --max-pixels each). Gone once the handler is done, refused or used; the answer's files stay for Gradio."""
    import gradio as gr

    import encoding
    from encoding.app.segment_tab import image_input, segment_handler

    work = _workdir(monkeypatch, tmp_path)
    with gr.Blocks():
        image = image_input(work, label="image")
    handler = segment_handler(encoding.load_model(tiny_folder), work)
    junk = image.preprocess(_inline(raw=os.urandom(3000)))  # not an image
    assert os.path.isfile(junk)
    with pytest.raises(gr.Error, match="is not an image this page can read"):
        handler(junk, "whole", False, None, None, "1")
    assert os.listdir(work) == []
    refused = image.preprocess(_inline(images["scene"]))  # an image, a request refused (its stride)
    with pytest.raises(gr.Error, match="stride 50 is larger than the window 20"):
        handler(refused, "slide", False, 20, 50, "1")
    assert os.listdir(work) == []
    used = image.preprocess(_inline(images["scene"]))
    overlay, mask, _, _, download = handler(used, "whole", False, None, None, "1")
    assert not os.path.exists(used) and os.listdir(work) == [os.path.basename(os.path.dirname(mask))]
    assert Image.open(mask).size == (61, 45) and os.path.dirname(overlay) == os.path.dirname(mask)


def test_answered_requests_folders_are_removed_once_gradio_has_copied_them(tiny_folder, images,
                                                                           monkeypatch, tmp_path):
    """Every request left a folder in the working folder for as long as the page ran. An answered request's stays
    a minute (Gradio copies the files returned into its own cache as it answers), at most 32 of them; a refused
    request's (a plan refused by the memory tool) goes at once."""
    import gradio as gr

    import encoding
    from encoding.app.plan_tab import plan_handler
    from encoding.app.segment_tab import segment_handler
    from encoding.app.workfiles import KEEP_FOLDERS, KEEP_S

    assert KEEP_S <= 600 and KEEP_FOLDERS >= 8
    clock = [0.0]
    work = _workdir(monkeypatch, tmp_path, clock, keep=3)
    segment = segment_handler(encoding.load_model(tiny_folder), work)
    masks = [segment(images["scene"], "whole", False, None, None, "1")[1] for _ in range(3)]
    assert all(os.path.isfile(m) for m in masks) and len(os.listdir(work)) == 3  # still to be copied by Gradio
    masks.append(segment(images["scene"], "whole", False, None, None, "1")[1])  # the 4th: the oldest goes
    assert [os.path.isfile(m) for m in masks] == [False, True, True, True] and len(os.listdir(work)) == 3
    clock[0] += KEEP_S
    plan = plan_handler(work)
    with pytest.raises(gr.Error, match="crop-size: must be > 0"):
        plan("fcn", "vgg_tiny", "shapes", None, 0, None, 2, "11GiB", "0B", ["gather"], "none", "none", False,
             progress=lambda *a, **k: None)
    assert os.listdir(work) == []  # those of a minute ago, and the refused plan's
    answer = plan("fcn", "vgg_tiny", "shapes", None, 32, None, 2, "11GiB", "0B", ["gather"], "none", "none",
                  False, progress=lambda *a, **k: None)
    assert os.path.isfile(answer[6]) and len(os.listdir(work)) == 1


def test_gradio_copies_the_files_a_handler_returns_into_its_cache(tmp_path, monkeypatch):
    """What lets the page remove a request's folder after it answered: the file is served from Gradio's copy."""
    import gradio as gr
    from gradio import processing_utils

    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "cache"))
    mine = tmp_path / "work" / "request"
    mine.mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(mine / "mask.png")
    with gr.Blocks():
        output = gr.File()
    payload = processing_utils.move_files_to_cache(output.postprocess(str(mine / "mask.png")), output,
                                                   postprocess=True)
    copy = payload["path"]
    assert os.path.realpath(copy).startswith(os.path.realpath(tmp_path / "cache")) and copy != str(mine / "mask.png")
    (mine / "mask.png").unlink()
    assert Image.open(copy).size == (4, 4)


def test_the_page_asks_gradio_to_empty_its_cache(tmp_path):
    """Gradio's copies (visitors' uploads, the files it served) only grew: the page's Blocks delete them hourly
    once an hour old, and all at shutdown (Gradio's ``delete_cache``)."""
    from encoding.app.page import CACHE_LIFETIME, build_page

    assert build_page(None, str(tmp_path)).delete_cache == CACHE_LIFETIME == (3600, 3600)


@pytest.mark.parametrize("when", ["serving", "starting"])
def test_sigterm_stops_the_page_and_removes_its_working_folder(monkeypatch, when):
    """``python -m encoding.app`` ended on SIGTERM (kill, systemd, docker stop) without removing its working folder:
    every request's files stayed in the system's temp folder. SIGTERM now stops it as Ctrl-C does: Gradio's loop
    closes the server, the folder goes, the command ends with status 0."""
    from encoding.app import cli, page

    seen = []

    def mine(*args):
        seen.append("the test's own handler")

    previous = signal.signal(signal.SIGTERM, mine)  # without the page's: SIGTERM would be noted, not obeyed

    class Page:
        def queue(self, **options):
            return self

        def launch(self, allowed_paths, **options):  # as Gradio's block_thread: until a KeyboardInterrupt
            seen.append(allowed_paths[0])
            (open(os.path.join(allowed_paths[0], "a request's file"), "w")).close()
            deadline = time.monotonic() + 10
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                while time.monotonic() < deadline:
                    time.sleep(0.05)
            except KeyboardInterrupt:
                seen.append("closed")
                return
            pytest.fail("SIGTERM did not stop the page")

    def build_page(model, workdir, *args):  # SIGTERM before Gradio's loop: Stopped, out of main quietly
        seen.append(workdir)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        pytest.fail("SIGTERM did not stop the page")

    monkeypatch.setattr(page, "build_page", (lambda *args, **kwargs: Page()) if when == "serving" else build_page)
    try:
        assert cli.cli(["--port", "1"]) == 0
        assert seen[1:] == (["closed"] if when == "serving" else []) and not os.path.exists(seen[0])
        assert signal.getsignal(signal.SIGTERM) is mine  # the test's handler is back
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen[-1] == "the test's own handler"
    finally:
        signal.signal(signal.SIGTERM, previous)
