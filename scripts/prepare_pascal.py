#!/usr/bin/env python
"""Download PASCAL VOC 2012 (pascal_voc) and SBD (pascal_aug, labels converted to PNGs once) into the data root.

Same as `python -m encoding.datasets.prepare pascal [options]`; see `--help` for the options.

Example:
    python scripts/prepare_pascal.py --no-aug         # VOC 2012 only
"""
from encoding.datasets.prepare import script_main

main = script_main("pascal")
if __name__ == "__main__":
    raise SystemExit(main())
