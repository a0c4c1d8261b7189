#!/usr/bin/env python
"""Peak memory per device of a training step under each data-parallel strategy (simulated or measured on GPUs).

Same as `python -m encoding.memory [options]`; see `--help` for the options and docs/memory.md for the figures.

Example:
    python scripts/memory_balance.py --model fcn --backbone resnet50 --simulate 4 --max-batch   # no GPU needed
"""
import sys

from encoding.memory.cli import cli

if __name__ == "__main__":
    sys.exit(cli())
