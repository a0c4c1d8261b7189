"""The command line of the web page: ``python -m encoding.app [--resume CKPT | --model DIR_OR_PRESET] [--trust-code]
[--host 127.0.0.1] [--port 7860] [--max-pixels N] [--plan-model MODEL] [--max-devices N] [--concurrency-limit N]
[--max-queue N]``.

The options are fields of :mod:`encoding.config` (:class:`~encoding.config.tools.AppOptions`, and ``--resume``
shared with ``train.py``). The network is loaded once by :func:`encoding.load_model` before the page is served
(a missing or unreadable checkpoint or folder, or one naming code without ``--trust-code``, ends here in one line,
exit status 2); without one, only the Plan memory tab works. The page computes ``--concurrency-limit`` requests at
a time and keeps ``--max-queue`` more waiting (Gradio's queue); a request beyond them is refused with a message.
Ctrl-C or SIGTERM stops the page and removes its working folder (each request's files, :mod:`.workfiles`).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading
from typing import Any, Iterator, List, Optional, Sequence

import torch

from ..config.parser import build_parser as config_parser
from ..inference.loading import model_info
from ..errors import MissingDependency, UsageError
from ..names import names_code, names_path
from ..utils.cli import run_cli
from ..utils.images import set_max_pixels
from .planning import PlanLimits

__all__ = ["build_parser", "parse_args", "load_network", "plan_limits", "require_gradio", "Stopped", "stop_on_sigterm",
           "served_paths", "main", "cli"]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m encoding.app``, generated from the option fields of :mod:`encoding.config`."""
    return config_parser("app")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse and check the options; a bad value ends in a one-line argparse error (exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.resume and args.model_source:
        parser.error("give --resume CKPT or --model DIR_OR_PRESET, not both")
    if args.resume and not os.path.isfile(args.resume):
        parser.error(f"--resume: no such checkpoint file: {args.resume!r}")
    return args


def load_network(args: argparse.Namespace) -> Optional[torch.nn.Module]:
    """The network of ``--resume`` / ``--model`` (:func:`encoding.load_model`, with ``--trust-code``) on
    ``--device``; ``None``: neither.

    Raises:
        UsageError: an unknown device; no such file, folder or preset. UntrustedCode: the file names code and
            ``--trust-code`` was not given. The other errors of :func:`encoding.load_model` (one line, naming the
            file).
    """
    from ..inference.loading import load_model

    source = args.resume or args.model_source
    if not source:
        return None
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as err:
        raise UsageError(f"--device {args.device!r}: {str(err).splitlines()[0]}") from None
    try:
        return load_model(source, device=device, trust_code=args.trust_code)
    except FileNotFoundError as err:  # the starter's option names nothing: a usage error (exit status 2)
        raise UsageError(str(err).splitlines()[0] if str(err) else f"no such file: {source!r}") from None


def plan_limits(args: argparse.Namespace, model: Optional[torch.nn.Module]) -> PlanLimits:
    """What the Plan memory tab plans: ``--plan-model`` (alone), the served network's model when it names code and
    ``--trust-code`` loaded it, at most ``--max-devices`` devices and ``--max-plan-work`` work."""
    served = model_info(model).options.get("model") if model is not None else None
    trusted = tuple(name for name in (args.plan_model, served) if name and (names_code(name) or names_path(name)))
    return PlanLimits(trusted=trusted, only=args.plan_model or None, max_devices=args.max_devices,
                      max_work=args.max_plan_work)


def require_gradio() -> Any:
    """The ``gradio`` module.

    Raises:
        MissingDependency: Gradio is not installed (the message says how to install it).
    """
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # the page calls no one
    try:
        import gradio
    except ImportError:
        raise MissingDependency("the web page needs Gradio: pip install 'encoding[app]' (or pip install -e "
                                "'.[app]' in a checkout)") from None
    return gradio


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of ``python -m encoding.app``: load the network, serve the page until interrupted."""
    args = parse_args(argv)
    require_gradio()
    set_max_pixels(args.max_pixels)  # every image the page reads: checked from its header before decoding
    model = load_network(args)
    from .page import build_page
    from .segmentation import upload_limit, validation_images

    examples = validation_images(model.info.dataset) if model is not None else []
    try:
        with stop_on_sigterm(), tempfile.TemporaryDirectory(prefix="encoding-app-") as workdir:
            page = build_page(model, workdir, examples, plan_limits(args, model))
            what = "no network (Plan memory only)" if model is None else f"{args.resume or args.model_source}"
            print(f"encoding.app: serving {what} on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
            page.queue(default_concurrency_limit=args.concurrency_limit, max_size=args.max_queue).launch(
                server_name=args.host, server_port=args.port, show_error=True, quiet=True,
                allowed_paths=served_paths(workdir, examples),
                max_file_size=upload_limit())  # until Ctrl-C or SIGTERM: Gradio's loop closes the server
    except Stopped:  # SIGTERM while the page was starting: stopped all the same, its working folder removed
        pass


class Stopped(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by :func:`stop_on_sigterm` (a ``KeyboardInterrupt``, as Gradio expects)."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM (``kill``, systemd, ``docker stop``) stops the page as Ctrl-C does: a
    :class:`Stopped` (a ``KeyboardInterrupt``) in the main thread, on which Gradio closes its server and the working
    folder is removed (the interpreter's default ends the process at once, leaving the folder behind). Outside the
    main thread (where no signal handler can be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise Stopped(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def served_paths(workdir: str, examples: Sequence[str]) -> List[str]:
    """What the page may serve besides Gradio's own files: its working folder and the example images themselves,
    not their folders (a dataset's training images, anything else there)."""
    return [workdir, *sorted(set(examples))]


def cli(argv: Optional[Sequence[str]] = None) -> int:
    """``main`` for the command line: an ``EncodingError`` is one line on stderr; returns the exit status."""
    return run_cli("python -m encoding.app", main, argv)
