"""Activation checkpointing: peak memory and step time against the same step without it, in one run.

    python benchmarks/bench_checkpoint.py                     # FCN-ResNet50, 2 images, crop 480, one device
    python benchmarks/bench_checkpoint.py --policies backbone --steps 3 --backbone resnet101

For each policy (``none`` first) it reports the real peak of one training step on the CPU (``torch.profiler`` memory
events, :func:`~encoding.memory.measure_program_cpu`), the simulator's peak for the same program (fake
tensors) and the time of an unprofiled step; the figures that matter are the ratios to ``none``. Nothing is
asserted: these machines are noisy, so compare ratios from the same run.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from encoding.memory import DeviceProgram, measure_program_cpu, segmentation_spec, simulate_program  # noqa: E402
from encoding.memory.tracker import MIB  # noqa: E402

#: One device holding the module and its optimizer, running the whole batch (the issue's measurement).
ONE_DEVICE = "balanced"


def _spec(args, policy):
    return segmentation_spec(args.model, args.backbone, args.nclass, args.crop_size, aux=args.aux,
                             recompute=policy)


def memory(args, policy):
    """Real (profiler) and simulated peak bytes of one training step on one device."""
    spec = _spec(args, policy)
    program = DeviceProgram(ONE_DEVICE, args.batch_size, args.batch_size, source=True, replicas=1)
    return measure_program_cpu(spec, program).peak, simulate_program(spec, program).peak


def _trainer(spec, batch_size):
    model = spec.build_model().train()
    optimizer = spec.optimizer([p for p in model.parameters() if p.requires_grad])
    (args, kwargs), target = spec.make_inputs(batch_size), spec.make_target(batch_size)

    def step():
        optimizer.zero_grad(set_to_none=True)
        spec.criterion(model(*args, **kwargs), target).backward()
        optimizer.step()
    return step


def step_times(args, policies):
    """Mean seconds of an unprofiled step per policy; the policies' steps alternate, so that a machine whose load
    changes during the run slows them alike."""
    steps = {policy: _trainer(_spec(args, policy), args.batch_size) for policy in policies}
    totals = dict.fromkeys(policies, 0.0)
    for round_ in range(args.steps + 1):  # round 0 warms up
        for policy, step in steps.items():
            start = time.perf_counter()
            step()
            if round_:
                totals[policy] += time.perf_counter() - start
    return {policy: total / max(args.steps, 1) for policy, total in totals.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="fcn")
    p.add_argument("--backbone", default="resnet50")
    p.add_argument("--nclass", type=int, default=21)
    p.add_argument("--crop-size", type=int, default=480)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--aux", action="store_true")
    p.add_argument("--policies", default="backbone,all", help="checkpoint policies compared with none")
    p.add_argument("--steps", type=int, default=3, help="timed steps per policy (0: memory only)")
    args = p.parse_args(argv)
    print(f"{args.model}-{args.backbone}, {args.batch_size} images, crop {args.crop_size}, one device, "
          f"{torch.get_num_threads()} threads")
    print(f"{'checkpoint':<10} {'real MiB':>9} {'sim MiB':>9} {'sim err':>8} {'step s':>8} {'peak/none':>10} "
          f"{'time/none':>10}")
    policies = ["none"] + [q for q in args.policies.split(",") if q and q != "none"]
    peaks = {policy: memory(args, policy) for policy in policies}
    times = step_times(args, policies) if args.steps else dict.fromkeys(policies, float("nan"))
    (real0, _), time0 = peaks["none"], times["none"]
    for policy in policies:
        (real, simulated), seconds = peaks[policy], times[policy]
        print(f"{policy:<10} {real / MIB:9.1f} {simulated / MIB:9.1f} {100 * (simulated - real) / real:+7.2f}% "
              f"{seconds:8.2f} {real / real0:10.3f} {seconds / time0:10.3f}", flush=True)

if __name__ == "__main__":
    main()
