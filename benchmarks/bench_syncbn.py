"""Forward+backward time of ``encoding.nn.SyncBatchNorm`` against ``nn.BatchNorm2d``.

(a) one device: the layers called directly (goal: ratio <= 1.05, the single-device path is ``F.batch_norm``);
(b) ``DataParallelModel`` with N CPU replicas (default 4): SyncBatchNorm (synchronised statistics) against
    nn.BatchNorm2d replicas (per-replica statistics, no synchronisation) — the price of the synchronisation.

Usage: ``python benchmarks/bench_syncbn.py [--device cuda] [--shape 16 64 56 56] [--replicas 4] [--iters 20]``
"""
from __future__ import annotations

import argparse
from typing import Callable, Dict

import torch
from torch import nn

from _timing import timed
from encoding.nn import SyncBatchNorm
from encoding.parallel import DataParallelModel


def _step_fn(layer: Callable, x: torch.Tensor, many: bool) -> Callable[[], None]:
    def step() -> None:
        out = layer(x)
        total = sum(o.sum() for o in out) if many else out.sum()
        total.backward()
    return step


def _compare(steps: Dict[str, Callable[[], None]], device: torch.device, iters: int, rounds: int) -> Dict[str, float]:
    """Best-of-rounds seconds per step of each entry (interleaved rounds; the minimum resists machine load)."""
    for step in steps.values():  # warm-up
        for _ in range(3):
            step()
    samples: Dict[str, list] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            samples[name].append(timed(step, device, iters, warmup=0))
    return {name: min(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", type=int, nargs=4, default=[16, 64, 56, 56], metavar=("N", "C", "H", "W"))
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    n, c, h, w = args.shape
    torch.manual_seed(0)
    x = torch.randn(n, c, h, w, device=device, requires_grad=True)
    bn, sync_bn = nn.BatchNorm2d(c).to(device), SyncBatchNorm(c).to(device)

    print(f"input {tuple(x.shape)} float32, torch {torch.__version__}, {torch.get_num_threads()} CPU threads")
    single = _compare({"BatchNorm2d": _step_fn(bn, x, False), "SyncBatchNorm": _step_fn(sync_bn, x, False)},
                      device, args.iters, args.rounds)
    print(f"(a) one device ({device}): BatchNorm2d {single['BatchNorm2d'] * 1e3:.2f} ms, "
          f"SyncBatchNorm {single['SyncBatchNorm'] * 1e3:.2f} ms, "
          f"ratio {single['SyncBatchNorm'] / single['BatchNorm2d']:.3f} (goal <= 1.05)")

    cpu = torch.device("cpu")
    xc = x.detach().cpu().requires_grad_()
    devices = ["cpu"] * args.replicas
    bn_cpu, sync_cpu = nn.BatchNorm2d(c), SyncBatchNorm(c)
    multi = _compare({"BatchNorm2d": _step_fn(DataParallelModel(bn_cpu, devices), xc, True),
                      "SyncBatchNorm": _step_fn(DataParallelModel(sync_cpu, devices), xc, True),
                      "single": _step_fn(bn_cpu, xc, False)},
                     cpu, args.iters, args.rounds)
    print(f"(b) {args.replicas} CPU replicas: BatchNorm2d replicas {multi['BatchNorm2d'] * 1e3:.2f} ms, "
          f"SyncBatchNorm replicas {multi['SyncBatchNorm'] * 1e3:.2f} ms, "
          f"ratio {multi['SyncBatchNorm'] / multi['BatchNorm2d']:.3f} "
          f"(whole batch on one CPU BatchNorm2d: {multi['single'] * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
