#!/usr/bin/env python
"""Download COCO 2017 (~19 GB) into <root>/coco and build the 21-class (VOC categories) masks (needs pycocotools).

Example:
    pip install pycocotools && python scripts/prepare_coco.py
"""
import sys
from typing import List, Optional

from encoding.datasets.coco import prepare_coco
from encoding.datasets.resources import checksum_overrides, prepare_argument_parser, run_cli


def main(argv: Optional[List[str]] = None) -> int:
    parser = prepare_argument_parser(__doc__)
    parser.add_argument("--no-masks", action="store_true", help="only download and extract")
    args = parser.parse_args(argv)
    return run_cli(lambda: prepare_coco(args.root, download_dir=args.download_dir, mirror=args.mirror,
                                        checksums=checksum_overrides(args.checksum), build_masks=not args.no_masks,
                                        overwrite=args.overwrite, progress=not args.no_progress))


if __name__ == "__main__":
    sys.exit(main())
