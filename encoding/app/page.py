"""The page: a Segment tab for the network (when there is one) and a Plan memory tab, in one ``gradio.Blocks``."""
from __future__ import annotations

from typing import Any, Optional, Sequence

from torch import nn

from ..inference.loading import model_info

from .plan_tab import plan_tab
from .planning import PlanLimits, PlanRequest, served_request
from .segment_tab import segment_tab

__all__ = ["TITLE", "CACHE_LIFETIME", "build_page"]

TITLE = "encoding: segment an image, plan the memory of training"
#: Gradio's ``delete_cache``: every hour, the files it copied into its cache (uploads, the masks and reports it
#: served) that are more than an hour old are deleted, and all of them when the page stops.
CACHE_LIFETIME = (3600, 3600)


def _plan_start(model: Optional[nn.Module], limits: PlanLimits) -> PlanRequest:
    if limits.only is not None:
        return PlanRequest(model=limits.only)
    return served_request(model_info(model)) if model is not None else PlanRequest()


def build_page(model: Optional[nn.Module], workdir: str, examples: Sequence[str] = (),
               limits: PlanLimits = PlanLimits()) -> Any:
    """The page (a ``gradio.Blocks``, not yet launched). The Plan memory tab starts on the served network (else on
    ``limits.only``, else on the memory tool's defaults).

    Args:
        model: the network of the Segment tab (from :func:`encoding.load_model`), ``None``: the tab says how to
            give one.
        workdir: where the mask PNGs and the memory reports are written (one fresh folder per request).
        examples: images the Segment tab offers to pick.
        limits: what the Plan memory tab plans (:class:`~.planning.PlanLimits`).
    """
    import gradio as gr

    with gr.Blocks(title=TITLE, analytics_enabled=False, delete_cache=CACHE_LIFETIME) as page:
        gr.Markdown(f"## {TITLE}")
        with gr.Tabs():
            with gr.Tab("Segment", id="segment"):
                segment_tab(model, workdir, examples)
            with gr.Tab("Plan memory", id="plan"):
                plan_tab(workdir, _plan_start(model, limits), limits)
    return page
