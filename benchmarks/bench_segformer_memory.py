"""SegFormer memory: the simulator's peak against real CPU allocations (torch.profiler), one device.

    python benchmarks/bench_segformer_memory.py                       # SegFormer-B2, 150 classes, 2 images, crop 512
    python benchmarks/bench_segformer_memory.py --backbone mit_b0 --crop-size 256

Prints the real peak, the simulated one (uncalibrated, and calibrated with the kernel workspaces learned from a real
step) and their errors; nothing is asserted (target: within 3%).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from encoding.config import RECOMPUTE_POLICIES  # noqa: E402
from encoding.memory import learn_workspaces, measure_program_cpu, segmentation_spec, simulate_program  # noqa: E402
from encoding.memory.program import DeviceProgram  # noqa: E402
from encoding.memory.tracker import MIB  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="mit_b2")
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--crop-size", type=int, default=512)
    parser.add_argument("--nclass", type=int, default=150)
    parser.add_argument("--recompute", choices=RECOMPUTE_POLICIES, default="none",
                        help="activation recomputation, as train.py's --recompute (default: none)")
    args = parser.parse_args()
    spec = segmentation_spec("segformer", args.backbone, args.nclass, args.crop_size,
                             recompute=args.recompute)
    program = DeviceProgram("balanced", args.images, args.images, source=True, replicas=1)
    start = time.perf_counter()
    real = measure_program_cpu(spec, program).peak
    measured = time.perf_counter() - start
    plain = simulate_program(spec, program).peak
    calibrated = simulate_program(spec, program, workspaces=learn_workspaces(spec)).peak
    print(f"segformer-{args.backbone}, {args.nclass} classes, {args.images} images, crop {args.crop_size}, "
          f"recompute {args.recompute} (real step {measured:.0f} s)")
    print(f"real {real / MIB:9.1f} MiB | simulated {plain / MIB:9.1f} MiB ({100 * (plain - real) / real:+.2f}%) | "
          f"calibrated {calibrated / MIB:9.1f} MiB ({100 * (calibrated - real) / real:+.2f}%)  (target 3%)")


if __name__ == "__main__":
    main()
