"""Memory simulator benchmark: speed, accuracy against real CPU allocations, and the planning table.

    python benchmarks/bench_memory.py speed       # all four strategies, EncNet-ResNet101, 16 images, 8 devices
    python benchmarks/bench_memory.py accuracy    # simulated vs real (torch.profiler) per device program, crop 480
    python benchmarks/bench_memory.py zoo         # one device, every architecture, uncalibrated and calibrated
    python benchmarks/bench_memory.py table       # per-device peaks and max batch at 11 GiB (docs/memory.md)
    python benchmarks/bench_memory.py advise      # --advise time: FCN-ResNet50, 150 classes, 8 x 11 GiB
                                                  #   (--baseline: and simulating every point, the same run;
                                                  #   --own-shards: and each policy sharding its own model;
                                                  #   --alone: and in one process, no traces ahead)
    python benchmarks/bench_memory.py scale       # --simulate N of FCN-ResNet50, 5 strategies: time vs devices
                                                  #   (8, 64, 256, 1024; --scale-devices; --baseline: and
                                                  #   fsdp's ranks simulated whole, the same run)
    python benchmarks/bench_memory.py loops       # both loops (--keep-outputs), simulated vs real CPU programs
    python benchmarks/bench_memory.py sharded     # fsdp / zero1 ranks vs a real multi-process gloo run
    python benchmarks/bench_memory.py amp         # bf16: one device, simulated vs a real CPU bf16 step

Every figure is a ratio or an error measured in the same run (these machines are noisy); nothing is asserted.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from encoding.memory import (Simulator, learn_workspaces, max_batch, measure_program_cpu,  # noqa: E402
                             segmentation_spec, simulate_program, strategy_peaks)
from encoding.memory.cli import main as tool_main, parse_memory  # noqa: E402
from encoding.memory.program import MEMORY_STRATEGIES, DeviceProgram, device_programs  # noqa: E402
from encoding.memory.tracker import CUDA_BLOCK, MIB  # noqa: E402
from encoding.models import ARCHITECTURES  # noqa: E402

CONFIGS = [("fcn", 21), ("fcn", 150), ("encnet", 21), ("encnet", 150)]


def _spec(model, nclass, crop=480, backbone="resnet50"):
    return segmentation_spec(model, backbone, nclass, crop, aux=True, se_loss=model == "encnet")


def speed(args):
    start = time.perf_counter()
    tool_main(["--model", "encnet", "--backbone", "resnet101", "--dataset", "ade20k", "--aux", "--se-loss",
               "--simulate", "8", "--batch-size", "16", "--crop-size", "480", "--out-dir", args.out_dir])
    seconds = time.perf_counter() - start
    print(f"speed: all four strategies of EncNet-ResNet101, 16 images, crop 480, 8 devices: {seconds:.1f} s "
          f"(target < 60 s, ratio {seconds / 60:.2f})")


def _distinct_programs(devices, per_device):
    split = [per_device] * devices
    programs = {}
    for strategy in ("gather", "balanced", "ddp"):
        for index, program in enumerate(device_programs(strategy, split)[:2]):
            programs[(strategy, "device 0" if index == 0 else "others")] = program
    return programs


def accuracy(args):
    print("accuracy: simulated vs real CPU peak (torch.profiler), crop 480, 2 images per device, 8 devices")
    print(f"{'config':<16} {'strategy':<9} {'device':<9} {'real MiB':>9} {'sim MiB':>9} {'err':>7} "
          f"{'calibrated':>11} {'err':>7}")
    worst = [0.0, 0.0]
    for model, nclass in CONFIGS:
        spec = _spec(model, nclass)
        workspaces = learn_workspaces(spec)
        for (strategy, role), program in _distinct_programs(8, 2).items():
            real = measure_program_cpu(spec, program).peak
            plain = simulate_program(spec, program).peak
            calibrated = simulate_program(spec, program, workspaces=workspaces).peak
            errors = [100 * (plain - real) / real, 100 * (calibrated - real) / real]
            worst = [max(w, abs(e)) for w, e in zip(worst, errors)]
            print(f"{model + '-' + str(nclass):<16} {strategy:<9} {role:<9} {real / MIB:9.1f} {plain / MIB:9.1f} "
                  f"{errors[0]:+6.2f}% {calibrated / MIB:11.1f} {errors[1]:+6.2f}%", flush=True)
    print(f"accuracy: worst |error| uncalibrated {worst[0]:.2f}%, calibrated {worst[1]:.2f}% (target 3%)")


def zoo(args):
    print(f"zoo: one device, {args.zoo_images} images, crop {args.zoo_crop}, 21 classes, ResNet-50, aux head")
    print(f"{'model':<9} {'real MiB':>9} {'sim MiB':>9} {'err':>7} {'calibrated':>11} {'err':>7}")
    program = DeviceProgram("balanced", args.zoo_images, args.zoo_images, source=True, replicas=1)
    for name in args.models or ARCHITECTURES:
        spec = _spec(name, 21, crop=args.zoo_crop)
        real = measure_program_cpu(spec, program).peak
        plain = simulate_program(spec, program).peak
        calibrated = simulate_program(spec, program, workspaces=learn_workspaces(spec)).peak
        print(f"{name:<9} {real / MIB:9.1f} {plain / MIB:9.1f} {100 * (plain - real) / real:+6.2f}% "
              f"{calibrated / MIB:11.1f} {100 * (calibrated - real) / real:+6.2f}%", flush=True)


def table(args):
    limit = parse_memory(args.memory_limit)
    print(f"table: simulated peaks (MiB, CUDA 512-byte blocks), crop 480, 2 images per device; max batch at "
          f"{args.memory_limit} per device")
    for model, nclass in CONFIGS:
        simulator = Simulator(_spec(model, nclass), CUDA_BLOCK)
        for devices in (4, 8):
            print(f"\n{model}-resnet50, {nclass} classes, {devices} devices, batch {2 * devices}")
            for strategy in MEMORY_STRATEGIES:
                split, peaks = strategy_peaks(simulator, strategy, 2 * devices, devices)
                biggest = max_batch(simulator, strategy, devices, limit)
                mean = sum(peaks) / len(peaks)
                print(f"  {strategy:<14} dev0 {peaks[0] / MIB:8.1f}  others {max(peaks[1:]) / MIB:8.1f}  "
                      f"max/mean {max(peaks) / mean:5.3f}  split {'/'.join(map(str, split))}  "
                      f"max batch {biggest}", flush=True)


def advise(args):
    """The tool's --advise (replays), and with --baseline the same advice simulating every point the searches ask
    (the search before replays) in the same run: both times, their ratio, and whether the answers are the same."""
    from encoding.memory.advice import advise as advise_rows
    from encoding.memory.report import advice_budget
    from encoding.memory.cli import parse_args

    for model in args.models or ["fcn"]:
        argv = ["--model", model, "--backbone", "resnet50", "--dataset", "ade20k", "--aux", "--simulate", "8",
                "--strategies", "gather,balanced,ddp,fsdp,zero1", "--advise", "--memory-limit", "11GiB",
                "--reserve", args.reserve, "--out-dir", args.out_dir] + (["--se-loss"] if model == "encnet" else [])
        start, cpu = time.perf_counter(), time.process_time()
        report = _advise_tool(argv, not args.one_process)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        if args.json:  # the run of another process (--alone)
            with open(args.json, "w") as out:
                json.dump({"advise_s": report["advise_s"], "wall": wall, "advice": report["advice"]}, out)
            return
        print(f"advise: {model}-ResNet50, 150 classes, 8 x 11GiB (--reserve {args.reserve}), 5 strategies x 3 "
              f"policies: advice {report['advise_s']:.1f} s (target <= 3 s, issue 45), "
              f"{report['advise_cpu_s']:.1f} s of CPU time (both processes); whole tool {wall:.1f} s wall, "
              f"{cpu:.1f} s of CPU time in this process (load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores)", flush=True)
        if args.alone:
            _alone(model, args, report, wall)
        if args.own_shards:
            _own_shards(argv, report)
        if not args.baseline:
            continue
        options = parse_args(argv)

        def spec_for(crop, policy):
            return segmentation_spec(model, "resnet50", options.nclass, crop, aux=True, se_loss=model == "encnet",
                                     recompute=policy)

        start, cpu, stats = time.perf_counter(), time.process_time(), {}
        rows = advise_rows(spec_for, options.strategies, 8, options.batch_size, options.crop_size,
                           advice_budget(options), CUDA_BLOCK, stats=stats, replay=False)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        same = [r.as_dict() for r in rows] == report["advice"]
        print(f"advise baseline (every point simulated, {stats['programs']} programs): {wall:.1f} s, {cpu:.1f} s of "
              f"CPU time; replays/baseline {report['advise_s'] / wall:.2f} wall, "
              f"{report['advise_cpu_s'] / cpu:.2f} CPU; answers {'the same' if same else 'DIFFERENT'}", flush=True)


def _advise_tool(argv, ahead):
    """The tool's report (``ahead``: its traces ahead in a second process, as on the command line), printing it."""
    from encoding.memory.cli import parse_args
    from encoding.memory.report import format_report, memory_report

    report = memory_report(parse_args(argv), ahead=ahead)
    print(format_report(report))
    return report


def _alone(model, args, report, wall):
    """The same tool run in a fresh interpreter with every simulation in one process (before the traces ahead):
    advice and whole-tool seconds, their ratios, and whether the answers are the same."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "alone.json")
        subprocess.run([sys.executable, os.path.abspath(__file__), "advise", "--models", model, "--reserve",
                        args.reserve, "--out-dir", args.out_dir, "--one-process", "--json", path],
                       check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            alone = json.load(f)
    same = alone["advice"] == report["advice"]
    print(f"advise in one process (a fresh interpreter, after this run): advice {alone['advise_s']:.1f} s, whole "
          f"tool {alone['wall']:.1f} s; with the traces ahead / in one process: advice "
          f"{report['advise_s'] / alone['advise_s']:.2f}, whole tool {wall / alone['wall']:.2f}; answers "
          f"{'the same' if same else 'DIFFERENT'}", flush=True)


def _own_shards(argv, report):
    """The tool's advice with every policy sharding its own ``fsdp`` model (before the further policies ran on the
    first one's), alternately with the advice as it is (the faster of two runs each: a second run finds the fake
    tensors' caches warm): seconds, ratio, and whether the answers are the same."""
    from encoding.memory import simulate

    runs, same = {False: [report["advise_s"], report["advise_cpu_s"]]}, True
    for own in (True, False, True):
        view = simulate.recompute_view
        if own:
            simulate.recompute_view = lambda base, other: None
        try:
            with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
                again = tool_main(argv)
        finally:
            simulate.recompute_view = view
        same = same and again["advice"] == report["advice"]
        best = runs.setdefault(own, [again["advise_s"], again["advise_cpu_s"]])
        best[:] = min(best, [again["advise_s"], again["advise_cpu_s"]])
    (wall, cpu), (own_wall, own_cpu) = runs[False], runs[True]
    print(f"advise, every policy sharding its own fsdp model: {own_wall:.1f} s wall, {own_cpu:.1f} s of CPU time; "
          f"now {wall:.1f} s, {cpu:.1f} s (ratio {wall / own_wall:.2f} wall, {cpu / own_cpu:.2f} CPU); answers "
          f"{'the same' if same else 'DIFFERENT'}", flush=True)


def scale(args):
    """The tool's --simulate N for FCN-ResNet50 (150 classes, 5 strategies) at each device count: wall and CPU
    seconds of the whole tool in this process (its imports measured once, in a fresh interpreter), the device
    programs simulated, and the load average (these machines are shared)."""
    import subprocess

    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import encoding.memory.cli"], check=True)
    imports = time.perf_counter() - start
    print(f"scale: FCN-ResNet50, 150 classes, 2 images per device, crop 480, strategies gather,balanced,ddp,fsdp,"
          f"zero1; a fresh interpreter importing the tool: {imports:.1f} s", flush=True)
    print(f"{'devices':>8} {'wall s':>8} {'CPU s':>8} {'+ imports':>10} {'load avg':>9}"
          + (f" {'baseline s':>11} {'ratio':>6} {'same':>5}" if args.baseline else ""))
    for devices in args.scale_devices:
        argv = ["--model", "fcn", "--backbone", "resnet50", "--dataset", "ade20k", "--aux", "--simulate",
                str(devices), "--strategies", "gather,balanced,ddp,fsdp,zero1", "--out-dir", args.out_dir]
        load = os.getloadavg()[0]
        if not args.baseline:
            report, wall, cpu = _quiet_run(argv)
            print(f"{devices:>8} {wall:8.1f} {cpu:8.1f} {wall + imports:10.1f} {load:9.1f}", flush=True)
            continue
        # fsdp's ranks simulated whole (before their composition) and composed, alternately twice (the second run
        # of a step finds the fake tensors' caches warm): the faster of each
        runs = {}
        for whole in (True, False, True, False):
            with _fsdp_ranks_whole() if whole else contextlib.nullcontext():
                report, wall, cpu = _quiet_run(argv)
            if whole not in runs or wall < runs[whole][1]:
                runs[whole] = (report, wall, cpu)
        (before, before_wall, _), (report, wall, cpu) = runs[True], runs[False]
        same = before["strategies"] == report["strategies"]
        print(f"{devices:>8} {wall:8.1f} {cpu:8.1f} {wall + imports:10.1f} {load:9.1f} {before_wall:11.1f} "
              f"{wall / before_wall:6.2f} {str(same):>5}", flush=True)


def _quiet_run(argv):
    """The tool's report, wall and CPU seconds of one run, its printing silenced."""
    start, cpu = time.perf_counter(), time.process_time()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        report = tool_main(argv)
    return report, time.perf_counter() - start, time.process_time() - cpu


@contextlib.contextmanager
def _fsdp_ranks_whole():
    """Inside: every distinct fsdp rank simulated whole (the simulator before its fsdp ranks were composed)."""
    from encoding.memory import simulate

    composed = simulate._COMPOSED_RANKS
    simulate._COMPOSED_RANKS = ("zero1",)
    try:
        yield
    finally:
        simulate._COMPOSED_RANKS = composed


def _compare(label, spec, program, workspaces=None, **calibrations):
    """One device program: real CPU peak against the simulation, and the calibrated ones (``workspaces``:
    "calibrated"; each keyword: its name)."""
    if workspaces is not None:
        calibrations = dict(calibrated=workspaces, **calibrations)
    real = measure_program_cpu(spec, program).peak
    sim = simulate_program(spec, program).peak
    line = f"{label:<44} real {real / MIB:9.1f}  sim {sim / MIB:9.1f}  {100 * (sim - real) / real:+6.2f}%"
    for name, table in calibrations.items():
        calibrated = simulate_program(spec, program, workspaces=table).peak
        line += f"  {name} {calibrated / MIB:9.1f}  {100 * (calibrated - real) / real:+6.2f}%"
    print(line, flush=True)


def loops(args):
    print(f"loops: simulated vs real CPU peak, crop {args.crop}, {args.per_device} images per device, "
          f"{args.devices} devices (each distinct device program; {torch.get_num_threads()} threads)")
    for model, nclass in args.configs:
        for keep in (False, True):
            spec = segmentation_spec(model, "resnet50", nclass, args.crop, aux=True, se_loss=model == "encnet",
                                     keep_outputs=keep)
            workspaces = learn_workspaces(spec) if args.calibrate else None
            for (strategy, role), program in _distinct_programs(args.devices, args.per_device).items():
                loop = "keep-outputs" if keep else "train.py"
                _compare(f"{model}-{nclass} {loop} {strategy} {role}", spec, program, workspaces)


def sharded_spec(model, nclass, crop, backbone="resnet50"):
    """Module level: the spawned ranks rebuild the step by name (aux head where the model has one)."""
    return segmentation_spec(model, backbone, nclass, crop, aux=model != "segformer")


def sharded(args):
    """Every rank of fsdp / zero1 (and ddp) simulated as a gloo rank (its collectives' staging buffers), against
    its own process's profiler peak in a real multi-process gloo group; calibrated on one thread, as the ranks run."""
    from encoding.memory import measure_ranks_cpu

    model, nclass = args.configs[0]
    kwargs = dict(model=model, nclass=nclass, crop=args.crop, backbone=args.backbone)
    spec = sharded_spec(**kwargs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    workspaces = learn_workspaces(spec)
    torch.set_num_threads(threads)
    plain, calibrated = Simulator(spec, backend="gloo"), Simulator(spec, workspaces=workspaces, backend="gloo")
    for ranks in args.ranks:
        split = [args.per_device] * ranks
        start = time.perf_counter()
        real = measure_ranks_cpu(sharded_spec, kwargs, args.strategies, split, threads=1)
        print(f"sharded {model}-{args.backbone}-{nclass}, crop {args.crop}, {args.per_device} images per rank, "
              f"{ranks} ranks (real gloo run: {time.perf_counter() - start:.0f} s)", flush=True)
        for strategy, results in real.items():
            rows = zip(results, plain.peaks(strategy, split), calibrated.peaks(strategy, split))
            for rank, (result, sim, cal) in enumerate(rows):
                print(f"  {strategy:<6} rank {rank}: real {result.peak / MIB:9.1f}  sim {sim / MIB:9.1f} "
                      f"{100 * (sim - result.peak) / result.peak:+6.2f}%  calibrated {cal / MIB:9.1f} "
                      f"{100 * (cal - result.peak) / result.peak:+6.2f}%", flush=True)


def amp(args):
    """bf16 on one device: uncalibrated, calibrated (``--calibrate``'s default shares 1, T, T+1), and calibrated
    without the measured share's real step (the table interpolates between the others)."""
    from encoding.memory.tracker import Workspaces

    program = DeviceProgram("balanced", args.per_device, args.per_device, source=True, replicas=1)
    print(f"amp: bf16, one device, {args.per_device} images, crop {args.crop}, 21 classes, ResNet-50, aux head; "
          f"{torch.get_num_threads()} threads")
    for model in args.models or ["fcn", "deeplab"]:
        spec = segmentation_spec(model, "resnet50", 21, args.crop, aux=True, amp_dtype=torch.bfloat16)
        full = learn_workspaces(spec)
        others = Workspaces({key: {share: held for share, held in known.items() if share != args.per_device}
                             for key, known in full.table.items()})
        _compare(f"bf16 {model}-21 one device", spec, program, full, without_share=others)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts = ["speed", "accuracy", "zoo", "table", "advise", "loops", "sharded", "amp", "scale"]
    parser.add_argument("parts", nargs="*", default=parts[:5], choices=parts)
    parser.add_argument("--crop", type=int, default=480, help="loops, sharded, amp: the crop")
    parser.add_argument("--per-device", type=int, default=2, help="loops, sharded, amp: images per device (rank)")
    parser.add_argument("--devices", type=int, default=8, help="loops: devices")
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4], help="sharded: world sizes")
    parser.add_argument("--strategies", nargs="*", default=["fsdp", "zero1", "ddp"], help="sharded: strategies")
    parser.add_argument("--backbone", default="resnet50", help="sharded: the backbone")
    parser.add_argument("--configs", nargs="*", default=CONFIGS[:2],
                        type=lambda text: (text.split("-")[0], int(text.split("-")[1])),
                        help="loops, sharded (the first): model-classes, e.g. fcn-150")
    parser.add_argument("--calibrate", action="store_true",
                        help="loops: also the calibrated simulation (sharded and amp always print it)")
    parser.add_argument("--out-dir", default="runs/bench_memory")
    parser.add_argument("--memory-limit", default="11GiB")
    parser.add_argument("--reserve", default="0B", help="advise: the tool's --reserve (default 0B: the figures of "
                        "docs/memory.md count allocations only)")
    parser.add_argument("--baseline", action="store_true",
                        help="advise: also the advice simulating every point (the search before replays), same run; "
                             "scale: also with fsdp's ranks simulated whole (before their composition), same run")
    parser.add_argument("--alone", action="store_true",
                        help="advise: also the tool with every simulation in one process (no traces ahead), in a "
                             "fresh interpreter")
    parser.add_argument("--one-process", action="store_true", help=argparse.SUPPRESS)  # --alone's run
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)  # --alone's run: its figures
    parser.add_argument("--own-shards", action="store_true",
                        help="advise: also with every policy sharding its own fsdp model (before), same run")
    parser.add_argument("--scale-devices", type=int, nargs="*", default=[8, 64, 256, 1024],
                        help="scale: the device counts")
    parser.add_argument("--zoo-images", type=int, default=2)
    parser.add_argument("--zoo-crop", type=int, default=480)
    parser.add_argument("--models", nargs="*", default=None,
                        help="zoo: these architectures only (default: all); advise: the models (default: fcn); "
                             "amp: the models (default: fcn deeplab)")
    args = parser.parse_args()
    for part in args.parts:
        globals()[part](args)


if __name__ == "__main__":
    main()
