#!/usr/bin/env python
"""Train-step speed of our DeepLabV3+, FPN and UPerNet (ResNet-50, or ``--backbone``) against
segmentation_models_pytorch's.

For each pair, both models are built from scratch (no weights) with the same number of classes and trained on the
same random batch: forward, cross-entropy, backward, SGD step (momentum 0.9). The two sides run in alternating rounds
(ours, smp, ours, smp, ...) so that a machine shared with other work slows both alike; the ratio ours / smp is taken
per round and the median is reported with the range of the rounds. Parameter counts and the forward GFLOPs per image
(``torch.utils.flop_counter.FlopCounterMode``, a multiply-add counts 2) show where a difference is architecture; the
last column, ``ratio x GFLOPs`` = (ours img/s x ours GFLOPs) / (smp img/s x smp GFLOPs), is the ratio at equal work.

With ``--compile`` our model also runs compiled (``encoding.engine.compile_model``: ``torch.compile``, inductor; C++
kernels on a CPU), in the same alternating rounds: the table adds compiled img/s, compiled / smp and compiled / eager,
and the seconds the first compiled step took (the compilation).

Needs ``segmentation-models-pytorch`` (in the ``test`` extras).

    python benchmarks/bench_peers.py                               # 2 x 3 x 128 x 128, 5 rounds
    python benchmarks/bench_peers.py --models deeplabv3plus --rounds 3
    python benchmarks/bench_peers.py --smp-like                   # our heads' smp-like options (see docs/models.md)
    python benchmarks/bench_peers.py --models fcfpn --profile 12  # + torch.profiler's top operators of each side
    python benchmarks/bench_peers.py --smp-like --compile          # + ours compiled (goal: >= 1.2 x smp)
    python benchmarks/bench_peers.py --smp-like --compile --device cuda --compile-mode auto  # CUDA graphs
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

from encoding.config.groups import COMPILE_CHOICES
from encoding.engine.compiled import compile_mode, compile_model
from encoding.models import get_segmentation_model
from encoding.models.flops import count_flops

#: our architecture -> (smp class name, smp keyword arguments, our smp-like head options).
PAIRS: Dict[str, Tuple[str, dict, dict]] = {
    "deeplabv3plus": ("DeepLabV3Plus", {"encoder_output_stride": 16}, {"separable": True}),
    "fcfpn": ("FPN", {}, {"fpn_dim": 128, "fuse_channels": 64}),
    "upernet": ("UPerNet", {}, {"fuse_channels": 256, "pool_channels": 256}),
}


#: The encoders both libraries build under one name (smp's ``encoder_name``, our ``backbone``).
BACKBONES = ("resnet18", "resnet34", "resnet50", "resnet101")


def build_pair(name: str, nclass: int, smp_like: bool, backbone: str = "resnet50") -> Tuple[nn.Module, nn.Module]:
    """Our model ``name`` on ``backbone`` (its default output stride) and smp's counterpart on the same encoder, both
    untrained."""
    import segmentation_models_pytorch as smp
    smp_class, smp_options, our_options = PAIRS[name]
    ours = get_segmentation_model(name, backbone=backbone, nclass=nclass, **(our_options if smp_like else {}))
    theirs = getattr(smp, smp_class)(encoder_name=backbone, encoder_weights=None, classes=nclass, **smp_options)
    return ours, theirs


def _logits(output) -> torch.Tensor:
    return output["out"] if isinstance(output, dict) else output


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               target: torch.Tensor) -> Callable[[], None]:
    """One training step of ``model`` on ``(x, target)``: forward, cross-entropy, backward, optimizer step."""
    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(_logits(model(x)), target).backward()
        optimizer.step()
    return step


def images_per_second(step: Callable[[], None], batch: int, iters: int, device: torch.device) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return iters * batch / (time.perf_counter() - start)


def profile(step: Callable[[], None], rows: int) -> str:
    """``torch.profiler``'s table of one train step: the ``rows`` operators with the most self CPU time."""
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def parameters(model: nn.Module) -> float:
    """Millions of parameters."""
    return sum(p.numel() for p in model.parameters()) / 1e6


def compare(name: str, args: argparse.Namespace) -> Dict[str, object]:
    """Alternating rounds of ours and smp's train steps for the pair ``name``; returns the row of the table."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    ours, theirs = build_pair(name, args.nclass, args.smp_like, args.backbone)
    models = {"ours": ours.to(device), "smp": theirs.to(device)}
    if args.compile:
        models["compiled"] = compile_model(copy.deepcopy(ours), compile_mode(args.compile_mode, [device]),
                                           dynamic=False)
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    target = torch.randint(0, args.nclass, (args.batch, args.size, args.size), device=device)
    steps, first = {}, {}
    for side, model in models.items():
        model.train()
        steps[side] = train_step(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), x, target)
        first[side] = 1 / images_per_second(steps[side], 1, 1, device)  # warm-up (compilation, kernels, state)
    rounds: Dict[str, List[float]] = {side: [] for side in models}
    for _ in range(args.rounds):
        for side in models:
            rounds[side].append(images_per_second(steps[side], args.batch, args.iters, device))
    ratios = [o / s for o, s in zip(rounds["ours"], rounds["smp"])]
    for side in ("ours", "smp") if args.profile else ():
        print(f"\n{name}, {side}: one train step, top {args.profile} operators by self CPU time\n"
              f"{profile(steps[side], args.profile)}")
    gflops = {side: count_flops(copy.deepcopy(model).cpu(), (args.size, args.size)) / 1e9
              for side, model in (("ours", ours), ("smp", theirs))}
    ratio = statistics.median(ratios)
    row = {"name": name, "smp": PAIRS[name][0], "ours": statistics.median(rounds["ours"]),
           "theirs": statistics.median(rounds["smp"]), "ratio": ratio, "low": min(ratios), "high": max(ratios),
           "params": (parameters(ours), parameters(theirs)), "gflops": (gflops["ours"], gflops["smp"]),
           "work_ratio": ratio * gflops["ours"] / gflops["smp"]}
    if args.compile:
        row.update(compiled=statistics.median(rounds["compiled"]), compile_s=first["compiled"],
                   vs_smp=statistics.median(c / s for c, s in zip(rounds["compiled"], rounds["smp"])),
                   vs_eager=statistics.median(c / o for c, o in zip(rounds["compiled"], rounds["ours"])))
    return row


def table_lines(rows: List[Dict[str, object]], args: argparse.Namespace) -> List[str]:
    """The Markdown table of ``rows`` (and of the compiled runs, with ``--compile``), a line each."""
    where = f"CPU, {torch.get_num_threads()} threads" if args.device == "cpu" else torch.cuda.get_device_name(
        args.device)
    lines = [f"Train step (forward, cross-entropy, backward, SGD), {where}, input "
             f"{args.batch}x3x{args.size}x{args.size}, {args.backbone}, {args.nclass} classes, {args.rounds} "
             f"alternating rounds x {args.iters} steps (median; per-round ratios in brackets)"
             f"{', our smp-like options' if args.smp_like else ''}:", "",
             "| ours | smp | ours img/s | smp img/s | ratio (rounds) | params ours / smp (M) | "
             "GFLOPs ours / smp | ratio x GFLOPs |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['name']} | {r['smp']} | {r['ours']:.2f} | {r['theirs']:.2f} | "
              f"**{r['ratio']:.2f}** ({r['low']:.2f}-{r['high']:.2f}) | {r['params'][0]:.1f} / {r['params'][1]:.1f} | "
              f"{r['gflops'][0]:.1f} / {r['gflops'][1]:.1f} | {r['work_ratio']:.2f} |" for r in rows]
    if args.compile:
        mode = compile_mode(args.compile_mode, [torch.device(args.device)])
        lines += ["", f"Compiled (encoding.engine.compile_model, inductor, --compile {args.compile_mode}: mode "
                  f"{mode}), same rounds:", "",
                  "| ours | compiled img/s | compiled / smp | compiled / eager | first compiled step (s) |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {r['name']} | {r['compiled']:.2f} | **{r['vs_smp']:.2f}** | {r['vs_eager']:.2f} | "
                  f"{r['compile_s']:.1f} |" for r in rows]
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(PAIRS), default=list(PAIRS))
    parser.add_argument("--backbone", default="resnet50", choices=BACKBONES, help="both sides' encoder")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--nclass", type=int, default=21)
    parser.add_argument("--iters", type=int, default=2, help="train steps per side and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--profile", type=int, default=0, metavar="ROWS",
                        help="also print torch.profiler's top ROWS operators of one step of each side")
    parser.add_argument("--compile", action="store_true", help="also run ours compiled (torch.compile, inductor)")
    parser.add_argument("--compile-mode", default="default", choices=[c for c in COMPILE_CHOICES if c != "none"],
                        help="train.py's --compile choice (auto: CUDA graphs on one CUDA device)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--smp-like", action="store_true",
                        help="build ours with the head options closest to smp's (PAIRS in this file)")
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print("\n" + "\n".join(table_lines([compare(name, args) for name in args.models], args)))


if __name__ == "__main__":
    main(sys.argv[1:])
