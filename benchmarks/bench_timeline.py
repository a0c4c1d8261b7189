"""The simulated memory timeline against real CPU allocations (issue 46, item 2): per distinct device program, the
simulated step and the same step run for real under ``torch.profiler`` (``profile_memory``), aligned storage for
storage (:mod:`encoding.memory.timeline_real`).

    python benchmarks/bench_timeline.py            # FCN-ResNet50 (aux head), 21 classes, crop 480, 2 images per
                                                   #   device, 8 devices, gather / balanced / ddp (minutes)
    python benchmarks/bench_timeline.py --quick    # FCN-ResNet18, crop 64: seconds

Columns: the simulated and the real peak (MiB, every storage: the kernels' own buffers count in the real one), the
real bytes live right after the simulated peak's event and how far that is from the real peak (the moment), the
storages of 1 KiB or more matched in order, and the largest difference in their live bytes at a matched event.
``ddp``'s real step runs a real ``DistributedDataParallel`` (one-process gloo group), whose bucket copies the
simulation models, not replays. Nothing is asserted: the figures are printed (docs/memory.md).
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from encoding.memory import Simulator, learn_workspaces, segmentation_spec  # noqa: E402
from encoding.memory.timeline import program_timeline  # noqa: E402
from encoding.memory.timeline_real import COLUMNS, compare, distinct_programs, measure_timeline_cpu, row  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="FCN-ResNet18 at crop 64")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--per-device", type=int, default=2)
    parser.add_argument("--strategies", default="gather,balanced,ddp")
    parser.add_argument("--calibrate", action="store_true", help="simulate with the kernels' workspaces learned "
                        "from real steps (learn_workspaces: three more real steps)")
    args = parser.parse_args()
    backbone, crop = ("resnet18", 64) if args.quick else ("resnet50", 480)
    spec = segmentation_spec("fcn", backbone, 21, crop, aux=True)
    print(f"FCN-{backbone} (aux), 21 classes, crop {crop}, {args.per_device} images per device, {args.devices} "
          f"devices; CPU, {torch.get_num_threads()} intra-op threads; "
          f"{'calibrated' if args.calibrate else 'uncalibrated'}")
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    worst = [0.0, 0.0]
    simulator = Simulator(spec, workspaces=learn_workspaces(spec) if args.calibrate else None)
    for name, program in distinct_programs(args.strategies.split(","), args.devices, args.per_device).items():
        begin = time.perf_counter()
        line = program_timeline(simulator, program)  # the timeline drawn, learned workspaces included
        start, events = simulator.result(program).trace
        result = compare(start, events, measure_timeline_cpu(spec, program), timeline=line)
        worst = [max(worst[0], abs(result["error"])), max(worst[1], abs(result["moment_error"]))]
        print("| " + " | ".join(row(name, result)) + f" |  ({time.perf_counter() - begin:.0f} s)", flush=True)
    print(f"worst |error|: peak {100 * worst[0]:.2f}%, at the simulated moment {100 * worst[1]:.2f}% (target 1%)")


if __name__ == "__main__":
    main()
