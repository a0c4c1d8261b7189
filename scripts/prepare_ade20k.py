#!/usr/bin/env python
"""Download ADE20K (ADEChallengeData2016, ~923 MB) and extract it into the data root.

Same as `python -m encoding.datasets.prepare ade20k [options]`; see `--help` for the options.

Example:
    python scripts/prepare_ade20k.py --mirror /mnt/archives --with-test
"""
from encoding.datasets.prepare import script_main

main = script_main("ade20k")
if __name__ == "__main__":
    raise SystemExit(main())
