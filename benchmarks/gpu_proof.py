"""The GPU proof in one command: one Markdown report of what only a GPU can show.

    python benchmarks/gpu_proof.py                      # writes runs/gpu_proof.md (about 12 minutes on one GPU)
    python benchmarks/gpu_proof.py --only compile slide  # some sections (--skip: all but some)
    python benchmarks/gpu_proof.py --quick --out r.md   # tiny models, small crops: seconds (CI runs it on the CPU)

Sections: ``pytest -m gpu``; the simulator (uncalibrated and ``--calibrate``d) against
``torch.cuda.max_memory_allocated`` for FCN-ResNet50, DeepLabV3-ResNet50, UPerNet-ConvNeXt-T and SegFormer-B2 at
crop 512, 8 images, fp32 and bf16; the step time of ``DataParallelModel`` + ``DataParallelCriterion`` against the
plain module and ``nn.DataParallel`` on one device; train images/s of our FCN-ResNet50 against torchvision's; the
CUDA context and the caching allocator's reserved-minus-allocated after the step, and the ``--reserve`` they suggest
for ``python -m encoding.memory --advise``; the simulated memory timeline of each device program of FCN-ResNet50
against ``torch.cuda.memory._snapshot()`` of the same step; train images/s of ours compiled (``--compile auto``: CUDA
graphs) against ours eager and segmentation_models_pytorch's DeepLabV3+, FPN and UPerNet at equal architecture
(``bench_peers.py``); ``encoding.segment(mode="slide")`` with batched windows against one window per forward
(``bench_slide.py``). Without CUDA every part that needs it says "skipped" and
why; the rest runs on the CPU, so the script keeps working where there is no GPU.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import subprocess
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import sync, timed  # noqa: E402
from encoding.memory import Simulator, learn_workspaces, segmentation_spec  # noqa: E402
from encoding.memory.tracker import CUDA_BLOCK, MIB  # noqa: E402
from encoding.models import get_segmentation_model  # noqa: E402
from encoding.nn import SegmentationLosses  # noqa: E402
from encoding.parallel import DataParallelCriterion, DataParallelModel  # noqa: E402
from encoding.utils.files import atomic_write  # noqa: E402

#: (name, model, backbone) of the memory section.
MODELS = [("FCN-ResNet50", "fcn", "resnet50"), ("DeepLabV3-ResNet50", "deeplab", "resnet50"),
          ("UPerNet-ConvNeXt-T", "upernet", "timm:convnext_tiny"), ("SegFormer-B2", "segformer", "mit_b2")]
#: The same in --quick mode (seconds on a CPU).
QUICK_MODELS = [("FCN-ResNet18", "fcn", "resnet18"), ("FCN-VGG-tiny", "fcn", "vgg_tiny")]
NO_CUDA = "skipped: CUDA is not available on this machine"


class Proof:
    """The report's settings and its Markdown lines."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.cuda = torch.cuda.is_available() and not args.cpu
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.crop, self.images = (64, 2) if args.quick else (512, 8)
        self.lines: List[str] = []

    def section(self, title: str, run: Callable[[], None]) -> None:
        start = time.perf_counter()
        self.lines += ["", f"## {title}", ""]
        try:
            run()
        except Exception as exc:  # noqa: BLE001 - a failed part is reported, the others still run
            traceback.print_exc()  # the whole traceback on stderr, one line in the report
            self.lines.append(f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        self.lines.append(f"\n({time.perf_counter() - start:.1f} s)")
        print(f"gpu_proof: {title}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)

    def table(self, header: List[str], rows: List[List[str]]) -> None:
        self.lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        self.lines += ["| " + " | ".join(row) + " |" for row in rows]


# ------------------------------------------------------------------------------------------------ sections
def gpu_tests(proof: Proof) -> None:
    if not proof.cuda:
        proof.lines.append(f"`pytest -m gpu`: {NO_CUDA}.")
        return
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"]
                          + gpu_test_files(root), cwd=root, capture_output=True, text=True,
                          timeout=proof.args.pytest_timeout)
    tail = [line for line in done.stdout.strip().splitlines() if line.strip()][-15:]
    proof.lines += [f"`pytest -m gpu` exit status {done.returncode}:", "", "```text"] + tail + ["```"]


def gpu_test_files(root: str) -> List[str]:
    """The test files that hold ``gpu``-marked tests: only they are collected, so a test module whose optional
    library (wandb, segmentation_models_pytorch...) the GPU machine lacks cannot stop the run at collection."""
    tests = os.path.join(root, "tests")
    found = []
    for name in sorted(os.listdir(tests)):
        if name.startswith("test_") and name.endswith(".py"):
            with open(os.path.join(tests, name), encoding="utf-8") as f:
                if "mark.gpu" in f.read():
                    found.append(os.path.join("tests", name))
    return found


def _spec_args(model: str, backbone: str, crop: int, amp: Optional[torch.dtype]) -> Dict[str, object]:
    return dict(model=model, backbone=backbone, nclass=150, crop_size=crop, aux=False, amp_dtype=amp)


def memory(proof: Proof) -> None:
    from encoding.memory import DeviceProgram

    models = QUICK_MODELS if proof.args.quick else MODELS
    program = DeviceProgram("balanced", proof.images, proof.images, source=True, replicas=1)
    rows = []
    for name, model, backbone in models:
        for dtype_name, amp in (("fp32", None), ("bf16", torch.bfloat16)):
            try:
                rows.append([name, dtype_name] + _memory_row(proof, program, _spec_args(model, backbone, proof.crop,
                                                                                         amp)))
            except Exception as exc:  # noqa: BLE001 - one failed row is reported, the others still run
                traceback.print_exc()
                rows.append([name, dtype_name, f"FAILED: {type(exc).__name__}"] + ["-"] * 4)
    proof.lines.append(f"One device, {proof.images} images, crop {proof.crop}, 150 classes, SGD step; MiB.")
    if not proof.cuda:
        proof.lines.append(f"Measured and calibrated columns {NO_CUDA} (the simulation needs no GPU).")
    proof.table(["model", "dtype", "max_memory_allocated", "simulated", "error", "calibrated", "error"], rows)


def _memory_row(proof: Proof, program: object, args: Dict[str, object]) -> List[str]:
    """max_memory_allocated, simulated, error, calibrated, error of one model and dtype."""
    spec = segmentation_spec(**args)
    simulated = Simulator(spec, CUDA_BLOCK).peak(program)
    real = calibrated = None
    if proof.cuda:
        from encoding.memory import measure_strategy

        real = measure_strategy(dict(args), "balanced", [0], proof.images)[1][0]
        workspaces = learn_workspaces(spec, device=proof.device)
        calibrated = Simulator(spec, CUDA_BLOCK, workspaces=workspaces).peak(program)
    return [_mib(real), _mib(simulated), _error(simulated, real), _mib(calibrated), _error(calibrated, real)]


def timeline(proof: Proof) -> None:
    """The simulated timeline of each distinct device program against the caching allocator's own record of the
    same step (``torch.cuda.memory._record_memory_history`` + ``_snapshot()``), storage for storage."""
    from encoding.memory.timeline_real import (COLUMNS, compare, distinct_programs, measure_timeline_cuda, row,
                                               simulated_events)

    backbone, crop, devices = ("resnet18", 64, 2) if proof.args.quick else ("resnet50", 480, 8)
    spec = segmentation_spec("fcn", backbone, 21, crop, aux=True)
    proof.lines.append(f"FCN-{backbone} (aux), 21 classes, crop {crop}, 2 images per device, {devices} devices; the "
                       "simulated step (512-byte blocks) against the allocator's trace of the same step on one GPU; "
                       "MiB.")
    rows = []
    for name, program in distinct_programs(("gather", "balanced", "ddp"), devices, 2).items():
        start, events, peak = simulated_events(spec, program, CUDA_BLOCK)
        if not proof.cuda:
            rows.append([name, f"{peak / MIB:.1f}"] + ["skipped"] + ["-"] * (len(COLUMNS) - 3))
            continue
        rows.append(row(name, compare(start, events, measure_timeline_cuda(spec, program, proof.device),
                                      round_to=CUDA_BLOCK)))
    if not proof.cuda:
        proof.lines.append(f"Real columns {NO_CUDA}.")
    proof.table(COLUMNS, rows)


def _mib(value: Optional[int]) -> str:
    return "skipped" if value is None else f"{value / MIB:.1f}"


def _error(simulated: Optional[int], real: Optional[int]) -> str:
    return "-" if simulated is None or not real else f"{100 * (simulated - real) / real:+.2f}%"


def _train_step(model: nn.Module, criterion: Callable, x: torch.Tensor, y: torch.Tensor,
                optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    def step() -> None:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def wrappers(proof: Proof) -> None:
    backbone = "vgg_tiny" if proof.args.quick else "resnet50"
    torch.manual_seed(0)
    net = get_segmentation_model("fcn", backbone=backbone, nclass=21).to(proof.device).train()
    x = torch.randn(proof.images, 3, proof.crop, proof.crop, device=proof.device)
    y = torch.randint(0, 21, (proof.images, proof.crop, proof.crop), device=proof.device)
    criterion = SegmentationLosses(nclass=21)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    device_ids = [proof.device]
    steps = {"plain module": _train_step(net, criterion, x, y, optimizer),
             "DataParallelModel + DataParallelCriterion": _train_step(
                 DataParallelModel(net, device_ids), DataParallelCriterion(criterion, device_ids), x, y, optimizer),
             "nn.DataParallel": _train_step(nn.DataParallel(net, device_ids=[0] if proof.cuda else None),
                                            lambda out, target: criterion(out["out"], target), x, y, optimizer)}
    repeat, warmup = (1, 0) if proof.args.quick else (10, 2)
    seconds = {name: timed(step, proof.device, repeat, warmup) for name, step in steps.items()}
    plain = seconds["plain module"]
    where = "one GPU" if proof.cuda else f"the CPU ({NO_CUDA}; nn.DataParallel without CUDA calls the module)"
    proof.lines.append(f"FCN-{backbone}, {proof.images} images, crop {proof.crop}, train step (forward, backward, "
                       f"SGD), on {where}; mean of {repeat} after {warmup} warm-up step(s).")
    proof.table(["wrapper", "s/step", "vs plain"],
                [[name, f"{s:.4f}", f"{s / plain:.3f}"] for name, s in seconds.items()])


def throughput(proof: Proof) -> None:
    from torchvision.models.segmentation import fcn_resnet50

    size, batch = (32, 1) if proof.args.quick else (proof.crop, proof.images)
    torch.manual_seed(0)
    theirs = fcn_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=False)
    ours = get_segmentation_model("fcn", backbone="resnet50", nclass=21)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(batch, 3, size, size, device=proof.device)
    y = torch.randint(0, 21, (batch, size, size), device=proof.device)
    rates: Dict[str, List[float]] = {"ours": [], "torchvision": []}
    steps = {}
    for name, model in (("ours", ours), ("torchvision", theirs)):
        model.to(proof.device).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        steps[name] = _train_step(model, lambda out, t: nn.functional.cross_entropy(out["out"], t), x, y, optimizer)
    rounds, repeat, warmup = (1, 1, 0) if proof.args.quick else (5, 5, 2)
    for _ in range(rounds):  # alternating rounds: both sides see the same machine state
        for name, step in steps.items():
            rates[name].append(batch / timed(step, proof.device, repeat, warmup))
    best = {name: max(values) for name, values in rates.items()}
    proof.lines.append(f"FCN-ResNet50 train step, {batch} x 3 x {size} x {size}, {rounds} alternating round(s) on "
                       f"{'the GPU' if proof.cuda else 'the CPU'}; mean of {repeat} step(s) per round, best round.")
    proof.table(["model", "images/s (best round)", "ratio ours / torchvision"],
                [["ours", f"{best['ours']:.2f}", f"{best['ours'] / best['torchvision']:.3f}"],
                 ["torchvision fcn_resnet50", f"{best['torchvision']:.2f}", "1"]])


def allocator(proof: Proof) -> None:
    if not proof.cuda:
        proof.lines.append(f"CUDA context and reserved-minus-allocated: {NO_CUDA}. The advice's `--reserve` keeps its "
                           "provisional default (docs/memory.md).")
        return
    sync(proof.device)
    free, total = torch.cuda.mem_get_info(proof.device)
    reserved, allocated = torch.cuda.memory_reserved(proof.device), torch.cuda.memory_allocated(proof.device)
    peak_gap = torch.cuda.max_memory_reserved(proof.device) - torch.cuda.max_memory_allocated(proof.device)
    context = total - free - reserved  # what the device holds beyond the caching allocator (this process alone)
    # At the step's peak the allocator holds what it reserved beyond what is allocated (max reserved - max
    # allocated); the cache left reserved after the step (reserved - allocated) is reused by the next step's
    # allocations and is not memory the peak needs on top.
    suggested = -(-(context + peak_gap) // (64 * MIB)) * 64 * MIB
    proof.table(["quantity", "MiB"], [
        ["CUDA context and other non-allocator memory (total - free - reserved)", f"{context / MIB:.1f}"],
        ["reserved - allocated after the steps", f"{(reserved - allocated) / MIB:.1f}"],
        ["max reserved - max allocated", f"{peak_gap / MIB:.1f}"],
        ["suggested --reserve (context + fragmentation, 64 MiB steps)", f"{suggested / MIB:.0f}"]])


def compile_speed(proof: Proof) -> None:
    """Ours compiled (``--compile auto``: CUDA graphs on one GPU) against ours eager and smp at equal architecture
    (``bench_peers.py --smp-like --compile``); issue 45's goal: compiled >= 1.2 x smp."""
    import bench_peers

    if importlib.util.find_spec("segmentation_models_pytorch") is None:
        proof.lines.append("skipped: segmentation_models_pytorch is not installed here (carry its wheel, "
                           "docs/memory.md)")
        return
    quick, compiled = proof.args.quick, proof.cuda or not proof.args.quick
    argv = ["--smp-like", "--device", str(proof.device)] + (["--compile", "--compile-mode", "auto"] if compiled else [])
    argv += ["--models", "fcfpn", "--backbone", "resnet18", "--size", "32", "--rounds", "1", "--iters", "1"] if quick \
        else ["--iters", "10"]
    args = bench_peers.build_parser().parse_args(argv)
    proof.lines += bench_peers.table_lines([bench_peers.compare(name, args) for name in args.models], args)
    if not compiled:
        proof.lines.append("\nCompiled: skipped in --quick mode on the CPU (inductor builds C++ kernels for minutes); "
                           "`python benchmarks/bench_peers.py --smp-like --compile` measures it.")


def slide(proof: Proof) -> None:
    """``encoding.segment(mode="slide")``: the default window batch against one window per forward
    (``bench_slide.py``)."""
    import bench_slide

    height, width, repeats = (128, 256, 1) if proof.args.quick else (1024, 2048, 3)
    r = bench_slide.measure(height, width, 64, proof.device, repeats, say=lambda line: None)
    proof.lines.append(f"`encoding.segment(mode=\"slide\")`, the main job's network (U-Net on vgg_tiny_s2), untrained, "
                       f"a {width} x {height} image, windows of 64 px every {r['stride']} px ({r['windows']} windows), "
                       f"on {'the GPU' if proof.cuda else 'the CPU'}; the fastest of {repeats} alternating run(s).")
    proof.table(["windows per forward", "seconds", "single / batched", "labels identical"],
                [["1", f"{r['single']:.3f}", "1", "-"],
                 [f"{min(r['chosen'], r['windows'])} (the default budget)", f"{r['batched']:.3f}",
                  f"{r['single'] / r['batched']:.2f}", str(r["identical"])]])


# ------------------------------------------------------------------------------------------------ main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join("runs", "gpu_proof.md"), help="the Markdown report")
    p.add_argument("--quick", action="store_true", help="tiny models and crops (CI, CPU)")
    p.add_argument("--cpu", action="store_true", help="skip CUDA even where there is a GPU")
    p.add_argument("--skip", nargs="*", default=[], choices=list(SECTIONS), help="sections to leave out")
    p.add_argument("--only", nargs="*", default=[], choices=list(SECTIONS), help="these sections alone")
    p.add_argument("--pytest-timeout", type=float, default=420, help="seconds for `pytest -m gpu`")
    return p


SECTIONS: Dict[str, Tuple[str, Callable[[Proof], None]]] = {
    "tests": ("pytest -m gpu", gpu_tests),
    "memory": ("Simulator against torch.cuda.max_memory_allocated", memory),
    "wrappers": ("DataParallelModel + DataParallelCriterion against the plain module and nn.DataParallel", wrappers),
    "throughput": ("Train images/s against torchvision's FCN", throughput),
    "allocator": ("CUDA context and the caching allocator after the steps", allocator),
    "timeline": ("Simulated timeline against torch.cuda.memory._snapshot()", timeline),
    "compile": ("Compiled training against eager and segmentation_models_pytorch", compile_speed),
    "slide": ("Batched sliding windows against one window per forward", slide),
}


def main(argv: Optional[List[str]] = None) -> str:
    """Run the proof, write the report atomically; return its text."""
    args = build_parser().parse_args(argv)
    proof = Proof(args)
    start = time.perf_counter()
    device = torch.cuda.get_device_name(0) if proof.cuda else "no CUDA device (CPU only)"
    proof.lines += ["# GPU proof", "", f"- device: {device}", f"- torch {torch.__version__}, Python "
                    f"{platform.python_version()}, {'quick (tiny models)' if args.quick else 'full'} mode"]
    for key, (title, run) in SECTIONS.items():
        if key not in args.skip and (not args.only or key in args.only):
            proof.section(title, lambda run=run: run(proof))
    proof.lines.append(f"\nTotal: {time.perf_counter() - start:.1f} s.")
    text = "\n".join(proof.lines) + "\n"
    folder = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(folder, exist_ok=True)
    atomic_write(args.out, text)
    print(f"wrote {args.out}")
    return text


if __name__ == "__main__":
    main()
