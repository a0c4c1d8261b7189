#!/usr/bin/env python
"""The README's main job, timed: the default ``train.py`` run on the embedded ``shapes`` data (not a timed test).

Runs ``experiments/segmentation/train.py`` with its defaults ``--runs`` times (seeds 1, 2, ...; each in a fresh run
directory) and prints, per run, the wall time and the final pixAcc / mIoU / worst class IoU, then the range. The data
is generated once before the first run (with ``--fresh-data`` into an empty temporary data root, timed, as on a
newcomer's first run).
The target (issue 11): mIoU >= 0.70 with every class >= 0.5 in <= 5 minutes on a 2-core CPU.

    python benchmarks/bench_mainjob.py                 # 3 runs of the default recipe
    python benchmarks/bench_mainjob.py --fresh-data    # the same, also timing the data generation
    python benchmarks/bench_mainjob.py --runs 1 -- --epochs 2     # extra train.py options after --
"""
import argparse
import importlib.util
import math
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train_script():
    spec = importlib.util.spec_from_file_location("train_script", os.path.join(ROOT, "experiments", "segmentation",
                                                                               "train.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fresh-data", action="store_true",
                        help="generate the data into an empty temporary root ($ENCODING_DATA) and time it")
    parser.add_argument("extra", nargs="*", help="train.py options (after --)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as data_root:
        if args.fresh_data:
            os.environ["ENCODING_DATA"] = data_root
        _bench(args)


def _bench(args: argparse.Namespace) -> None:
    train = _train_script()
    from encoding.datasets import get_segmentation_dataset
    start = time.perf_counter()
    get_segmentation_dataset("shapes", split="val")  # generate the data once, before the first timed run
    generation = time.perf_counter() - start
    rows = []
    for seed in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            result = train.main(["--seed", str(seed), "--output-dir", out, *args.extra])
            seconds = time.perf_counter() - start
        worst = min(v for v in result["IoU"].tolist() if not math.isnan(v))
        rows.append((seed, seconds, result["pixAcc"], result["mIoU"], worst))
    print("\nseed  wall s   pixAcc   mIoU   worst class IoU")
    for seed, seconds, pix, miou, worst in rows:
        print(f"{seed:>4}  {seconds:6.1f}   {pix:.4f}  {miou:.4f}  {worst:.4f}")
    walls, mious = [r[1] for r in rows], [r[3] for r in rows]
    print(f"wall {min(walls):.1f}-{max(walls):.1f} s, mIoU {min(mious):.4f}-{max(mious):.4f}, "
          f"worst class IoU {min(r[4] for r in rows):.4f} (target: mIoU >= 0.70, every class >= 0.5, <= 300 s on "
          f"2 CPU cores; {os.cpu_count()} here)")
    print(f"data generation (or check, if present): {generation:.1f} s; a newcomer's first run takes it plus run 1's "
          "wall time and the interpreter start")


if __name__ == "__main__":
    main(sys.argv[1:])
