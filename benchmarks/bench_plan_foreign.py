"""``encoding.memory.plan(model, criterion, sample=...)`` against real CPU allocations, for models the toolkit did not
build: torchvision's ``resnet50`` classifier (``CrossEntropyLoss(label_smoothing=0.1)``, ``(N,)`` targets) and
``deeplabv3_mobilenet_v3_large`` (a ``{"out", "aux"}`` dict, ``output_key="out"``).

Usage:
    python benchmarks/bench_plan_foreign.py            # the two models of issue 34, one device, several batches
    python benchmarks/bench_plan_foreign.py --small    # the small versions the test runs

The ground truth is this file's own: a plain training loop (``loss = criterion(model(x)[key], y); loss.backward();
optimizer.step(); optimizer.zero_grad(set_to_none=True)``, after one warm-up step) run for real on the CPU under
``torch.profiler`` with ``profile_memory=True``; the peak is the largest ``"Total Allocated"`` of the profiler's CPU
memory events inside the measured step (the profiler starts before the model is built, so that count is every live
byte of the run). It shares no code with the simulator or with :func:`encoding.memory.measure_program_cpu`.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from encoding.memory import learn_workspaces, plan  # noqa: E402
from encoding.memory.profiler import trace_events  # noqa: E402
from encoding.memory.program import StepSpec, default_optimizer  # noqa: E402
from encoding.memory.tracker import Workspaces  # noqa: E402

_MARK = "bench_plan_foreign.step"


def real_peak(build: Callable[[], nn.Module], criterion: Callable[..., Any], sample: Callable[[int], Tuple[Any, Any]],
              batch: int, output_key: Optional[str] = None) -> int:
    """Peak live CPU bytes of one real training step (after a warm-up step), from the profiler's memory events."""
    def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        inputs, targets = sample(batch)
        output = model(inputs)
        del inputs
        loss = criterion(output if output_key is None else output[output_key], targets)
        del output
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    gc.collect()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        model = build().train()
        optimizer = default_optimizer([p for p in model.parameters() if p.requires_grad])
        step(model, optimizer)
        with torch.profiler.record_function(_MARK):
            step(model, optimizer)
    events = trace_events(prof)
    span = next(e for e in events if e.get("name") == _MARK and e.get("ph") == "X")
    start, end = span["ts"], span["ts"] + span["dur"]
    memory = sorted((e["ts"], e["args"]["Total Allocated"], e["args"].get("Bytes", 0)) for e in events
                    if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == 0)
    # the allocator's count is process-wide and outlives a profiler session (what an earlier run freed after its
    # session ended is still counted): the level when this session's first event happened is the zero
    zero = memory[0][1] - memory[0][2]
    before = [total for ts, total, _ in memory if ts < start][-1:]
    return max(before + [total for ts, total, _ in memory if start <= ts <= end]) - zero


def planned_peak(build: Callable[[], nn.Module], criterion: Callable[..., Any],
                 sample: Callable[[int], Tuple[Any, Any]], batch: int, output_key: Optional[str] = None,
                 workspaces: Optional[Workspaces] = None) -> int:
    """The planner's peak of the same step on one device (CPU granularity; ``backend="gloo"``: CPU processes, whose
    convolution kernels' buffers the planner probes), calibrated with ``workspaces``."""
    result = plan(build(), criterion, sample=sample, batch=batch, num_devices=1, output_key=output_key,
                  round_to=1, backend="gloo", workspaces=workspaces)
    return result.peaks["balanced"][0]


def calibrate(case: Dict[str, Any]) -> Workspaces:
    """The CPU kernels' workspaces of ``case`` (``--calibrate``'s real steps of 1, T and T + 1 samples)."""
    sample, key = case["sample"], case["output_key"]
    loss = case["criterion"] if key is None else (lambda output, target: case["criterion"](output[key], target))
    spec = StepSpec(build_model=case["build"], make_inputs=lambda n: ((sample(n)[0],), {}),
                    make_target=lambda n: sample(n)[1], criterion=loss)
    return learn_workspaces(spec)


def classifier_case(small: bool) -> Dict[str, Any]:
    """torchvision's resnet50 (resnet18 at 64 px when small), CrossEntropyLoss(label_smoothing=0.1)."""
    from torchvision.models import resnet18, resnet50
    size, classes = (64, 10) if small else (224, 1000)

    def sample(n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(n, 3, size, size), torch.zeros(n, dtype=torch.long)

    def build() -> nn.Module:
        torch.manual_seed(0)
        return (resnet18 if small else resnet50)(weights=None, num_classes=classes)

    return dict(name="resnet18 classifier" if small else "resnet50 classifier", build=build, sample=sample,
                criterion=nn.CrossEntropyLoss(label_smoothing=0.1), output_key=None)


def segmentation_case(small: bool) -> Dict[str, Any]:
    """torchvision's deeplabv3_mobilenet_v3_large, its ``"out"`` into CrossEntropyLoss(ignore_index=255)."""
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large
    size = 64 if small else 224

    def sample(n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(n, 3, size, size), torch.zeros(n, size, size, dtype=torch.long)

    def build() -> nn.Module:
        torch.manual_seed(0)
        return deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=5 if small else 21)

    return dict(name="deeplabv3_mobilenet_v3_large", build=build, sample=sample,
                criterion=nn.CrossEntropyLoss(ignore_index=255), output_key="out")


def compare(case: Dict[str, Any], batch: int, workspaces: Optional[Workspaces] = None) -> Dict[str, float]:
    """Real, planned and calibrated peaks (bytes) of ``case`` at ``batch``, and the relative errors."""
    args = (case["build"], case["criterion"], case["sample"], batch, case["output_key"])
    real = real_peak(*args)
    row = {"real": real, "planned": planned_peak(*args)}
    if workspaces is not None:
        row["calibrated"] = planned_peak(*args, workspaces=workspaces)
    for name in ("planned", "calibrated"):
        if name in row:
            row[name + "_error"] = (row[name] - real) / real
    return row


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the small versions of the test")
    parser.add_argument("--batches", default="2,4", help="comma-separated batch sizes (default 2,4; deeplabv3 trains on 2 or more)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'model':30s} {'batch':>5s} {'real MiB':>9s} {'planned':>9s} {'error':>8s} {'calibrated':>10s} "
          f"{'error':>8s}")
    for case in (classifier_case(args.small), segmentation_case(args.small)):
        workspaces = calibrate(case)
        for batch in (int(b) for b in args.batches.split(",")):
            r = compare(case, batch, workspaces)
            print(f"{case['name']:30s} {batch:5d} {r['real'] / 2**20:9.2f} {r['planned'] / 2**20:9.2f} "
                  f"{r['planned_error']:+8.2%} {r['calibrated'] / 2**20:10.2f} {r['calibrated_error']:+8.2%}",
                  flush=True)


if __name__ == "__main__":
    main()
