#!/usr/bin/env python
"""Generate the embedded shapes dataset into the data root (it is also generated automatically on first use).

Same as `python -m encoding.datasets.prepare shapes [options]`; see `--help` for the options.

Example:
    python scripts/prepare_shapes.py --seed 3 --num-train 1000
"""
from encoding.datasets.prepare import script_main

main = script_main("shapes")
if __name__ == "__main__":
    raise SystemExit(main())
