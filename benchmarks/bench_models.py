"""Benchmark of encoding.models on CPU.

1. Forward+backward images/s of our FCN-ResNet50 vs torchvision's ``fcn_resnet50`` (same weights, same input size,
   train mode), measured in alternating rounds; prints the ratio ours / torchvision (goal >= 0.97). With
   ``--compile`` ours also runs compiled (``encoding.engine.compile_model``: inductor, C++ kernels on a CPU) in the same
   rounds: compiled / eager and compiled / torchvision, and the seconds of the first compiled step.
2. Parameter counts of every registered model (ResNet-50 and ResNet-101 backbones, 21 classes), as a Markdown table
   (the table in docs/models.md).

Usage: ``python benchmarks/bench_models.py [--size 128] [--batch 2] [--iters 3] [--rounds 5] [--threads N]
[--compile]``
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torchvision.models.segmentation import deeplabv3_resnet50, fcn_resnet50

from encoding.engine.compiled import compile_model
from encoding.models import ARCHITECTURES, get_segmentation_model


def images_per_second(model: torch.nn.Module, x: torch.Tensor, iters: int) -> float:
    """Forward+backward throughput of ``model`` on ``x`` over ``iters`` iterations."""
    start = time.perf_counter()
    for _ in range(iters):
        model(x)["out"].mean().backward()
    return iters * x.shape[0] / (time.perf_counter() - start)


def speed(size: int, batch: int, iters: int, rounds: int, compiled: bool = False) -> None:
    torch.manual_seed(0)
    theirs = fcn_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=False).train()
    ours = get_segmentation_model("fcn", backbone="resnet50", nclass=21).train()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(batch, 3, size, size)
    models = {"ours": ours, "torchvision": theirs}
    if compiled:
        models["ours compiled"] = compile_model(copy.deepcopy(ours), dynamic=False)
    first = {name: 1 / images_per_second(model, x[:1], 1) for name, model in models.items()}  # warm-up, compilation
    results = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            results[name].append(images_per_second(model, x, iters))
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"FCN-ResNet50 forward+backward, CPU ({torch.get_num_threads()} threads), input {batch}x3x{size}x{size}, "
          f"{rounds} rounds x {iters} iterations (median):")
    for name, value in med.items():
        print(f"  {name:12s} {value:6.2f} images/s   (rounds: {', '.join(f'{v:.2f}' for v in results[name])})")
    print(f"  ratio ours / torchvision = {med['ours'] / med['torchvision']:.3f}  (goal >= 0.97)")
    if compiled:
        print(f"  ratio compiled / eager = {med['ours compiled'] / med['ours']:.3f}, compiled / torchvision = "
              f"{med['ours compiled'] / med['torchvision']:.3f} (first compiled step: {first['ours compiled']:.1f} s)")


def count(model: torch.nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def parameter_table(nclass: int = 21) -> None:
    print(f"\nParameters with {nclass} classes (aux: + auxiliary FCNHead on c3; EncNet also + SE-loss branch):")
    print("\n| model | class | backbone | params (M) | params (M) with aux |")
    print("|---|---|---|---:|---:|")
    for backbone in ("resnet50", "resnet101"):
        for name, arch in ARCHITECTURES.items():
            with torch.device("meta"):  # structure only
                plain = get_segmentation_model(name, backbone=backbone, nclass=nclass)
                full = get_segmentation_model(name, backbone=backbone, nclass=nclass, aux=True, se_loss=arch.se_loss)
            print(f"| {name} | {arch.model.__name__} | {backbone} | {count(plain):.2f} | {count(full):.2f} |")
    for name, factory in (("fcn", fcn_resnet50), ("deeplab", deeplabv3_resnet50)):
        with torch.device("meta"):
            theirs = factory(weights=None, weights_backbone=None, num_classes=nclass, aux_loss=True)
            ours = get_segmentation_model(name, backbone="resnet50", nclass=nclass, aux=True)
        exact = [sum(p.numel() for p in m.parameters()) for m in (ours, theirs)]
        print(f"{name}/resnet50 with aux: ours {exact[0]:,} parameters, torchvision {factory.__name__} {exact[1]:,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--skip-speed", action="store_true", help="only print the parameter table")
    parser.add_argument("--compile", action="store_true", help="also time ours compiled (torch.compile, inductor)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.skip_speed:
        speed(args.size, args.batch, args.iters, args.rounds, args.compile)
    parameter_table()


if __name__ == "__main__":
    main()
