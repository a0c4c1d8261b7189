"""Timing helpers shared by the benchmark scripts (``from _timing import sync, timed``)."""
from __future__ import annotations

import time
from typing import Callable

import torch

__all__ = ["sync", "timed"]


def sync(device: torch.device) -> None:
    """Wait for the queued work of a CUDA device (no-op elsewhere), so wall-clock timings are honest."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeat: int, warmup: int = 2) -> float:
    """Seconds per call of ``fn``: ``warmup`` untimed calls, then the mean over ``repeat`` synchronized calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync(device)
    return (time.perf_counter() - start) / repeat
