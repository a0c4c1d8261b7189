"""The Segment tab's layout: an image in, the overlay and the legend of the classes present beside it, the mask,
each class's share and the mask PNG out (computed by :mod:`.segmentation`)."""
from __future__ import annotations

import base64
import binascii
import math
import os
from typing import Any, List, Optional, Sequence, Tuple
from urllib.parse import unquote_to_bytes

from torch import nn

from ..errors import MissingDependency
from ..inference.loading import model_info
from ..utils.files import atomic_write
from ..utils.images import max_pixels
from .messages import COMPUTE, on_page
from .rendering import write_overlay
from .segmentation import (BYTES_PER_PIXEL, MODES, SegmentRequest, legend_html, parse_scales, segment_image,
                           upload_limit, write_mask)
from .workfiles import work_folders

__all__ = ["SHARE_HEADERS", "image_input", "segment_handler", "segment_tab"]

#: The columns of the classes' shares.
SHARE_HEADERS = ["class", "colour", "pixels", "share %"]


def _window(value: Any, name: str) -> Optional[int]:
    """A form's window / stride: empty or 0 (what the page's empty number field sends) -> ``None`` (the default),
    else a positive whole number."""
    if value is None or value == "" or value == 0:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number != int(number) or number < 0:
        raise ValueError(f"{name}: expected a positive whole number of pixels (or 0: the default), got {value}")
    return int(number)


def _data_url_file(url: str, folder: str) -> str:
    """The bytes of a ``data:`` URL (an image an API client sent inline) written to a file of ``folder``, not decoded
    as an image (the handler checks its header like an upload's); refused above an upload's limit before decoding.

    Raises:
        gradio.Error: the URL holds more bytes than :func:`~.segmentation.upload_limit`.
    """
    import gradio as gr

    header, _, data = url.partition(",")
    coded = header.endswith(";base64")
    size = len(data) * 3 // 4 - (len(data) - len(data.rstrip("="))) if coded else len(data) - 2 * data.count("%")
    limit = upload_limit()
    if size > limit:
        raise gr.Error(f"the inline image holds about {size:,} bytes, over the page's limit of {limit:,} "
                       f"bytes ({BYTES_PER_PIXEL} a pixel of --max-pixels {max_pixels():,})")
    try:
        raw = base64.b64decode(data, validate=True) if coded else unquote_to_bytes(data)
    except binascii.Error:
        raw = b""  # not base64: an empty file, which the handler refuses as no image
    path = work_folders(folder).inline("inline-image")  # removed by the handler once done with it
    atomic_write(path, raw)
    return path


def _uploaded_file(path: str, examples: Sequence[str]) -> str:
    """``path`` once it is a file Gradio received from a visitor (inside its upload folder) or one of the page's
    ``examples``. A request can name any server path in the image's ``path`` (without Gradio's ``meta`` marker
    Gradio does not check it): that file would have been read and its overlay served back.

    Raises:
        gradio.Error: any other path (the message does not repeat it).
    """
    import gradio as gr
    from gradio.utils import get_upload_folder

    real = os.path.realpath(path)
    upload = os.path.realpath(get_upload_folder())
    if real.startswith(upload + os.sep) or real in {os.path.realpath(example) for example in examples}:
        return path
    raise gr.Error("the image is not a file uploaded to this page: send the image itself (an upload, or a data: URL "
                   "in the request)")


def image_input(workdir: str, examples: Sequence[str] = (), **options: Any) -> Any:
    """A ``gradio.Image`` upload that hands the handler the uploaded file as it is (its path), never decoded by
    Gradio: the handler checks its size from its header (:func:`~.segmentation.check_image_size`) before the
    datasets' reader reads it (EXIF orientation, 16-bit grey), and a file that is no image gets this page's message
    (Gradio's own preprocessing would decode it first, whatever its size, and answer with its internals). An image
    sent inline (a ``data:`` URL) is written to a file of ``workdir`` as it is (the handler removes it once done
    with it: :meth:`~.workfiles.WorkFolders.release`); a path is taken only inside Gradio's upload folder or among
    the page's ``examples`` (:func:`_uploaded_file`), and an ``http(s)://`` URL is refused before Gradio downloads
    it (:func:`_refuse_url`). The methods are replaced on the instance: a subclass of a Gradio component makes Gradio
    write a ``.pyi`` file beside this module."""
    import gradio as gr

    image = gr.Image(type="filepath", image_mode=None, **options)
    move_to_cache = getattr(image, "async_move_resource_to_block_cache", None)
    if move_to_cache is None:  # the Gradio step that downloads a request's URL: never served unguarded
        raise MissingDependency(f"gradio {gr.__version__}: its image box has no async_move_resource_to_block_cache "
                                "step to guard against request URLs (the page knows gradio 6's); install gradio 6")

    def uploaded_file(payload: Any) -> Optional[str]:
        if payload is None:
            return None
        if str(payload.url or "").startswith("data:"):
            return _data_url_file(str(payload.url), workdir)
        return _uploaded_file(str(payload.path), examples) if getattr(payload, "path", None) else None

    async def no_download(path: Any) -> Optional[str]:
        _refuse_url(path)
        return await move_to_cache(path)

    image.preprocess = uploaded_file
    image.async_move_resource_to_block_cache = no_download
    return image


def _refuse_url(path: Any) -> None:
    """Refuse an image named by an ``http(s)://`` URL, before Gradio fetches it: Gradio downloads a request's URL
    into its cache before the handler sees it, bypassing its upload limit, and holds the whole answer in memory
    (a 400 MiB answer raised the server's peak memory by 800 MiB).

    Raises:
        gradio.Error: ``path`` is an ``http://`` or ``https://`` URL (the message does not repeat it).
    """
    import gradio as gr

    if str(path or "").lower().startswith(("http://", "https://")):
        raise gr.Error("the image is a URL: this page fetches nothing a request names; send the image itself (an "
                       "upload, or a data: URL in the request)")


def segment_handler(model: nn.Module, workdir: str):
    """The function the tab calls: ``(image path, mode, flip, window, stride, scales) -> (overlay JPEG, mask PNG,
    legend HTML, shares, mask PNG)``; its errors are messages on the page. Each picture is encoded once, at the
    image's size (the mask PNG is shown and offered for download as the same file)."""

    folders = work_folders(workdir)

    @on_page
    def segment(image: Optional[str], mode: str, flip: bool, window: Any, stride: Any,
                scales: str) -> Tuple[str, str, str, List[List[Any]], str]:
        try:
            windows = mode != "whole"  # the form's window fields say "(slide / multi-scale)": "whole" reads none
            request = SegmentRequest(mode=mode, flip=bool(flip), window=_window(window, "window") if windows else None,
                                     stride=_window(stride, "stride") if windows else None,
                                     scales=parse_scales(scales) if mode == "multi-scale" else SegmentRequest.scales)
            result = segment_image(model, image, request)
        finally:
            folders.release(image)  # an image sent inline: its file goes, refused or used
        stem = os.path.splitext(os.path.basename(image))[0] if isinstance(image, str) else "image"
        with folders.request() as folder:  # Gradio copies the files returned into its cache (.workfiles)
            mask_path = write_mask(result.mask, os.path.join(folder, f"{stem}_mask.png"))
            overlay_path = write_overlay(result.overlay, os.path.join(folder, f"{stem}_overlay.jpg"))
        shares = [[name, "#%02x%02x%02x" % colour, pixels, round(100 * share, 2)]
                  for name, colour, pixels, share in result.shares]
        return overlay_path, mask_path, result.legend, shares, mask_path

    return segment


def segment_tab(model: Optional[nn.Module], workdir: str, examples: Sequence[str] = ()) -> None:
    """The tab's components and events (inside a ``gradio.Blocks``); ``examples``: images offered to pick (the
    validation images of the network's dataset, :func:`~.segmentation.validation_images`)."""
    import gradio as gr

    if model is None:
        gr.Markdown("No network to segment with: start the page with `--resume CKPT` (a `train.py` checkpoint) or "
                    "`--model DIR_OR_PRESET` (a `save_pretrained` folder, a Hub id or a preset name).")
        return
    info = model_info(model)
    options = info.options
    gr.Markdown(f"**{options.get('model', type(model).__name__)}** / {options.get('backbone', '-')} trained on "
                f"**{info.dataset}**: {info.num_classes} classes (training crop {info.crop_size}, base size "
                f"{info.base_size}); images of at most {max_pixels():,} pixels")
    gr.HTML(legend_html(info), elem_id="encoding-legend")
    with gr.Row():
        with gr.Column():
            image = image_input(workdir, examples, label="image", sources=["upload", "clipboard"],
                                elem_id="encoding-image")
            mode = gr.Radio(list(MODES), value="whole", label="mode",
                            info="whole image at once, overlapping windows, or several scales")
            flip = gr.Checkbox(False, label="flip", info="average with the mirrored image")
            with gr.Row():
                window = gr.Number(None, precision=0, label="window (slide / multi-scale)",
                                   info=f"0: the training crop ({info.crop_size})")
                stride = gr.Number(None, precision=0, label="stride", info="0: two thirds of the window")
            scales = gr.Textbox("0.75,1.0,1.25", label="scales (multi-scale)",
                                info="relative to the training base size")
            button = gr.Button("Segment", variant="primary", elem_id="encoding-segment")
            if examples:
                gr.Examples([[path] for path in examples], [image], label=f"validation images of {info.dataset}")
        with gr.Column():
            overlay = gr.Image(type="filepath", label="overlay", interactive=False, elem_id="encoding-overlay")
            present = gr.HTML(elem_id="encoding-present-legend")
            mask = gr.Image(type="filepath", label="mask", interactive=False, elem_id="encoding-mask")
            shares = gr.Dataframe(headers=SHARE_HEADERS, label="share of the image", interactive=False,
                                  elem_id="encoding-shares")
            download = gr.File(label="mask PNG (pixel values: class ids)", interactive=False,
                               elem_id="encoding-mask-file")
    handler = segment_handler(model, workdir)
    inputs, outputs = [image, mode, flip, window, stride, scales], [overlay, mask, present, shares, download]
    button.click(handler, inputs, outputs, api_name="segment", concurrency_id=COMPUTE)
    image.upload(handler, inputs, outputs, api_name=False, concurrency_id=COMPUTE)
