#!/usr/bin/env python
"""Download VOC 2010 + PASCAL-Context's trainval_merged.json and convert them to 59-class label PNGs (pcontext).

Same as `python -m encoding.datasets.prepare pcontext [options]`; see `--help` for the options.

Example:
    python scripts/prepare_pcontext.py --root /data
"""
from encoding.datasets.prepare import script_main

main = script_main("pcontext")
if __name__ == "__main__":
    raise SystemExit(main())
