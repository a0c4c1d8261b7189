"""encoding.app: a web page for a trained network and for the memory planner (``python -m encoding.app``).

Two tabs, built on Gradio (``pip install -e '.[app]'``): **Segment** (an image through :func:`encoding.segment`,
whole, by sliding windows or multi-scale, with flip: the overlay with the legend of the classes present beside it,
the mask PNG, each class's share) and **Plan memory** (the report of ``python -m encoding.memory`` for the options of
the page: the per-device table, the chart with the memory limit, the advice, the timeline). The page binds
``127.0.0.1`` unless told otherwise. It is a server: it imports no code a request names, checks an image's size from
its header before decoding it, and bounds its queue and the plans it simulates (docs/app.md, "Trust").

Modules: ``segmentation``, ``rendering`` and ``planning`` (what each tab computes, without Gradio), ``segment_tab`` /
``plan_tab`` (the tabs' layout), ``page`` (the page), ``cli`` (the command line). ``import encoding`` imports none
of them, and nothing here imports Gradio before the page is built.
"""
from __future__ import annotations

import argparse
from typing import Any, Optional, Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m encoding.app``: :func:`encoding.app.cli.build_parser`."""
    from .cli import build_parser as make_parser

    return make_parser()


def main(argv: Optional[Sequence[str]] = None) -> Any:
    """``python -m encoding.app``: :func:`encoding.app.cli.main` (loads the network, serves the page)."""
    from .cli import main as run

    return run(argv)
