"""Overhead of encoding.parallel.

(a) step time of DataParallelModel + DataParallelCriterion on ONE device vs the plain module + criterion
    (forward + loss + backward; goal: ratio <= 1.01);
(b) time to replicate a ResNet-101-sized model onto 4 replicas as % of one forward pass (goal: <= 2%).

Both are measured in the same run, interleaved, and reported as medians: the machines are noisy.

    python benchmarks/bench_parallel.py [--device cpu|cuda] [--repeats 15]
"""
import argparse
import statistics
import time

import torch
import torchvision
from torch import nn

from encoding.parallel import DataParallelCriterion, DataParallelModel, replicate


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def bench_step_overhead(device: torch.device, repeats: int, batch: int, size: int) -> float:
    net = torchvision.models.resnet18(num_classes=10).to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    model, dp_criterion = DataParallelModel(net, [device]), DataParallelCriterion(criterion, [device])
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def plain_step():
        net.zero_grad(set_to_none=True)
        criterion(net(x), y).backward()

    def parallel_step():
        net.zero_grad(set_to_none=True)
        dp_criterion(model(x), y).backward()

    for _ in range(3):
        plain_step(), parallel_step()
    plain, parallel = [], []
    for _ in range(repeats):  # interleaved so drift affects both alike
        plain.append(_timed(plain_step, device))
        parallel.append(_timed(parallel_step, device))
    p, q = statistics.median(plain), statistics.median(parallel)
    print(f"(a) one-device step: plain {p * 1e3:.2f} ms, DataParallelModel+Criterion {q * 1e3:.2f} ms, "
          f"ratio {q / p:.4f} (goal <= 1.01)")
    return q / p


def bench_replication(device: torch.device, repeats: int, batch: int) -> float:
    net = torchvision.models.resnet101().to(device)
    x = torch.randn(batch, 3, 224, 224, device=device)
    with torch.no_grad():
        net(x)
    forwards, replications = [], []
    for _ in range(max(3, repeats // 3)):
        with torch.no_grad():
            forwards.append(_timed(lambda: net(x), device))
        replications.append(_timed(lambda: replicate(net, [device] * 4), device))
    f, r = statistics.median(forwards), statistics.median(replications)
    n_params = sum(p.numel() for p in net.parameters()) / 1e6
    print(f"(b) replicate ResNet-101 ({n_params:.1f}M params) x4: {r * 1e3:.2f} ms; one forward (batch {batch}): "
          f"{f * 1e3:.2f} ms; replication = {100 * r / f:.2f}% of a forward (goal <= 2%)")
    return r / f


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=112)
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"device: {device}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    bench_step_overhead(device, args.repeats, args.batch, args.size)
    bench_replication(device, args.repeats, args.batch)


if __name__ == "__main__":
    main()
