"""Memory simulator against real CPU allocations for the timm backbones (one device, a training step).

    python benchmarks/bench_backbones_memory.py                  # ResNeSt50-DeepLabV3 and ConvNeXt-T-UperNet
    python benchmarks/bench_backbones_memory.py --calibrate      # also the simulator with learned workspaces
    python benchmarks/bench_backbones_memory.py --models upernet:timm:convnext_tiny --crop 256

Each row: the real peak of a step on the CPU (``measure_program_cpu``, torch.profiler) and the simulated one
(``simulate_program``, fake tensors), 150 classes, aux head, 2 images, crop 512 by default. Nothing is asserted.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from encoding.memory import learn_workspaces, measure_program_cpu, segmentation_spec, simulate_program  # noqa: E402
from encoding.memory.program import DeviceProgram  # noqa: E402
from encoding.memory.tracker import MIB  # noqa: E402

MODELS = ["deeplab:resnest50", "upernet:timm:convnext_tiny"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=MODELS, help="model:backbone pairs")
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--crop", type=int, default=512)
    parser.add_argument("--nclass", type=int, default=150)
    parser.add_argument("--calibrate", action="store_true", help="also simulate with learned kernel workspaces")
    args = parser.parse_args()
    print(f"one device, {args.images} images, crop {args.crop}, {args.nclass} classes, aux head: real CPU peak "
          "(torch.profiler) vs simulated (fake tensors)")
    print(f"{'model':<30} {'real MiB':>9} {'sim MiB':>9} {'err':>7}" + (f" {'calibrated':>11} {'err':>7}"
                                                                       if args.calibrate else ""))
    program = DeviceProgram("balanced", args.images, args.images, source=True, replicas=1)
    for entry in args.models:
        model, backbone = entry.split(":", 1)
        spec = segmentation_spec(model, backbone, args.nclass, args.crop, aux=True)
        real = measure_program_cpu(spec, program).peak
        plain = simulate_program(spec, program).peak
        line = f"{model + '-' + backbone:<30} {real / MIB:9.1f} {plain / MIB:9.1f} {100 * (plain - real) / real:+6.2f}%"
        if args.calibrate:
            calibrated = simulate_program(spec, program, workspaces=learn_workspaces(spec)).peak
            line += f" {calibrated / MIB:11.1f} {100 * (calibrated - real) / real:+6.2f}%"
        print(line, flush=True)


if __name__ == "__main__":
    main()
