#!/usr/bin/env python
"""Generate the embedded `shapes` dataset into the data root (it is also generated automatically on first use).

Example:
    python scripts/prepare_shapes.py                        # <root>/shapes, 400 train + 100 val scenes, seed 0
    python scripts/prepare_shapes.py --seed 3 --num-train 1000
"""
import argparse
import sys
from typing import List, Optional

from encoding.datasets.resources import run_cli
from encoding.datasets.shapes import DEFAULT_NUM_TRAIN, DEFAULT_NUM_VAL, DEFAULT_SEED, prepare_shapes


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None, help="data root (default: $ENCODING_DATA or ~/.encoding/data)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--num-train", type=int, default=DEFAULT_NUM_TRAIN)
    parser.add_argument("--num-val", type=int, default=DEFAULT_NUM_VAL)
    parser.add_argument("--overwrite", action="store_true", help="generate again even if complete")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    return run_cli(lambda: prepare_shapes(args.root, seed=args.seed, num_train=args.num_train,
                                          num_val=args.num_val, overwrite=args.overwrite,
                                          progress=not args.no_progress))


if __name__ == "__main__":
    sys.exit(main())
