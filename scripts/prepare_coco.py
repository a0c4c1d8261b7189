#!/usr/bin/env python
"""Download COCO 2017 (~19 GB) into <root>/coco and build the 21-class (VOC categories) masks (needs pycocotools).

Same as `python -m encoding.datasets.prepare coco [options]`; see `--help` for the options.

Example:
    pip install "encoding[prepare]" && python scripts/prepare_coco.py
"""
from encoding.datasets.prepare import script_main

main = script_main("coco")
if __name__ == "__main__":
    raise SystemExit(main())
