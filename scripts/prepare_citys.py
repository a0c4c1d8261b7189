#!/usr/bin/env python
"""Prepare Cityscapes (citys) from the two packages downloaded by hand (the site needs a login).

Same as `python -m encoding.datasets.prepare citys [options]`; see `--help` for the options.

Example:
    python scripts/prepare_citys.py --zips ~/Downloads      # without --zips: prints what to download
"""
from encoding.datasets.prepare import script_main

main = script_main("citys")
if __name__ == "__main__":
    raise SystemExit(main())
