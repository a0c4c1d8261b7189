"""Batched sliding windows vs one window at a time: ``encoding.segment(mode="slide")`` on one large image.

The main job's network (the shapes recipe: U-Net on ``vgg_tiny_s2``, output stride 8, windows of its 64 px crop every
42 px), untrained, on a random 2048 x 1024 image: seconds of one window per forward, then of the default window
batch (as many windows as 64 MiB holds on a CPU, :class:`encoding.inference.predict.WindowBudget`), the window batch
chosen, the ratio, and whether the labels are identical. Each way runs ``--repeats`` times (the fastest counts:
one run's time moves by a third on a shared machine), alternately, after a warm-up on a small image.

Usage: ``python benchmarks/bench_slide.py [--height 1024] [--width 2048] [--window 64] [--device cpu]
[--threads N] [--repeats 3]``
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import encoding
from _timing import sync
from encoding.inference.predict import WindowBudget, to_batch
from encoding.models import get_segmentation_model
from encoding.models.multieval import _windows


def seconds(model: torch.nn.Module, image: np.ndarray, window: int, device: torch.device, **how) -> tuple:
    """``(seconds, labels)`` of one ``encoding.segment`` call."""
    sync(device)
    start = time.perf_counter()
    labels = encoding.segment(model, image, mode="slide", window=window, device=device, **how)
    sync(device)
    return time.perf_counter() - start, labels


def measure(height: int = 1024, width: int = 2048, window: int = 64, device: torch.device = torch.device("cpu"),
            repeats: int = 3, say=print) -> dict:
    """One window per forward against the default window batch, the fastest of ``repeats`` alternating runs each:
    ``{"single", "batched"}`` (seconds), ``"windows"`` (how many), ``"chosen"`` (the default window batch),
    ``"identical"`` (whether the labels are); ``say`` hears the running figures."""
    torch.manual_seed(0)
    model = get_segmentation_model("unet", dataset="shapes", backbone="vgg_tiny_s2", output_stride=8).to(device).eval()
    image = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    for how in ({"window_batch": 1}, {}):  # warm-up: kernels and caches of both batch sizes
        seconds(model, image[:2 * window, :4 * window], window, device, **how)
    single = batched = float("inf")
    for _ in range(max(1, repeats)):  # alternately: a slow spell of the machine hits both ways
        took, labels_single = seconds(model, image, window, device, window_batch=1)
        single = min(single, took)
        took, labels_batched = seconds(model, image, window, device)
        batched = min(batched, took)
        say(f"one window per forward: {single:.2f} s, batched: {batched:.2f} s (fastest so far)")
    stride = window * 2 // 3
    count = len(_windows(height, window, stride)) * len(_windows(width, window, stride))
    with torch.no_grad():
        chosen = WindowBudget(model)(to_batch(image[:window, :window]).to(device))
    return {"single": single, "batched": batched, "windows": count, "chosen": chosen, "stride": stride,
            "identical": bool(torch.equal(labels_single, labels_batched))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way (the fastest counts)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    r = measure(args.height, args.width, args.window, device, args.repeats, lambda line: print(line, flush=True))
    print(f"unet-vgg_tiny_s2 slide, {args.width} x {args.height} image, window {args.window} / stride {r['stride']} "
          f"({r['windows']} windows), {device} ({torch.get_num_threads()} threads):")
    print(f"  one window per forward    {r['single']:7.2f} s")
    print(f"  {min(r['chosen'], r['windows']):4d} windows per forward {r['batched']:7.2f} s   (default budget: "
          f"{r['chosen']} windows)")
    print(f"  ratio single / batched = {r['single'] / r['batched']:.2f}  (goal >= 2)   labels identical: "
          f"{r['identical']}")


if __name__ == "__main__":
    main()
