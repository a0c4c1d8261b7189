"""Update time of SegmentationMetric vs a bincount confusion matrix in the style of torchvision's references and vs a
naive per-class loop (PyTorch-Encoding-like areas per class).

Default workload: predictions and targets 8x512x512, 150 classes, ~10% ignore pixels (-1). All three accumulate the
same statistics (checked). Prints mean milliseconds per update and the ratios ours/reference (goal <= 1.0) and
ours/naive.

    python benchmarks/bench_metrics.py [--device cuda] [--batch 8] [--size 512] [--nclass 150] [--repeat 10]
"""
import argparse

import torch

from _timing import timed
from encoding.utils import SegmentationMetric


class BincountReference:
    """Confusion matrix as in torchvision's segmentation references: mask valid targets, index, bincount."""

    def __init__(self, n):
        self.n = n
        self.mat = None

    def update(self, target, pred):
        n = self.n
        if self.mat is None:
            self.mat = torch.zeros((n, n), dtype=torch.int64, device=target.device)
        with torch.inference_mode():
            k = (target >= 0) & (target < n)
            inds = n * target[k].to(torch.int64) + pred[k]
            self.mat += torch.bincount(inds, minlength=n ** 2).reshape(n, n)


class NaiveLoop:
    """Per-class intersection / prediction / target areas, one class at a time."""

    def __init__(self, n):
        self.n = n
        self.inter = self.area_pred = self.area_target = None

    def update(self, target, pred):
        valid = target >= 0
        inter, area_pred, area_target = [], [], []
        for c in range(self.n):
            p = (pred == c) & valid
            t = target == c
            inter.append((p & t).sum())
            area_pred.append(p.sum())
            area_target.append(t.sum())
        stats = [torch.stack(v) for v in (inter, area_pred, area_target)]
        if self.inter is None:
            self.inter, self.area_pred, self.area_target = stats
        else:
            self.inter += stats[0]
            self.area_pred += stats[1]
            self.area_target += stats[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--nclass", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--naive-repeat", type=int, default=2)
    args = parser.parse_args()
    device = torch.device(args.device)
    n = args.nclass
    g = torch.Generator().manual_seed(0)
    shape = (args.batch, args.size, args.size)
    target = torch.randint(0, n, shape, generator=g)
    target[torch.rand(shape, generator=g) < 0.1] = -1
    pred = torch.randint(0, n, shape, generator=g)
    target, pred = target.to(device), pred.to(device)

    ours, ref, naive = SegmentationMetric(n), BincountReference(n), NaiveLoop(n)
    t_ours = timed(lambda: ours.update(pred, target), device, args.repeat) * 1e3
    t_ref = timed(lambda: ref.update(target, pred), device, args.repeat) * 1e3
    t_naive = timed(lambda: naive.update(target, pred), device, args.naive_repeat, warmup=1) * 1e3

    conf = ours.confusion.cpu() // (args.repeat + 2)
    assert torch.equal(conf, ref.mat.cpu() // (args.repeat + 2)), "ours and the reference disagree"
    naive_calls = args.naive_repeat + 1
    assert torch.equal(conf.diagonal(), naive.inter.cpu() // naive_calls), "ours and the naive loop disagree"
    assert torch.equal(conf.sum(0), naive.area_pred.cpu() // naive_calls)

    print(f"device={device} threads={torch.get_num_threads()} batch={shape} nclass={n} torch={torch.__version__}")
    print(f"SegmentationMetric.update : {t_ours:9.2f} ms")
    print(f"bincount reference        : {t_ref:9.2f} ms")
    print(f"naive per-class loop      : {t_naive:9.2f} ms")
    print(f"ratio ours / reference    : {t_ours / t_ref:9.3f}  (goal <= 1.0)")
    print(f"ratio ours / naive        : {t_ours / t_naive:9.3f}")


if __name__ == "__main__":
    main()
