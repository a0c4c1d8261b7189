#!/usr/bin/env python
"""Download PASCAL VOC 2012 (pascal_voc, ~2 GB) and the SBD augmented set (pascal_aug, ~1.4 GB) into the data root.

Example:
    python scripts/prepare_pascal.py                  # both
    python scripts/prepare_pascal.py --no-aug         # VOC 2012 only
"""
import sys
from typing import List, Optional

from encoding.datasets.pascal_voc import prepare_pascal
from encoding.datasets.resources import checksum_overrides, prepare_argument_parser, run_cli


def main(argv: Optional[List[str]] = None) -> int:
    parser = prepare_argument_parser(__doc__)
    parser.add_argument("--no-voc", action="store_true", help="skip VOC 2012")
    parser.add_argument("--no-aug", action="store_true", help="skip the SBD augmented set")
    args = parser.parse_args(argv)
    return run_cli(lambda: prepare_pascal(args.root, voc=not args.no_voc, aug=not args.no_aug,
                                          download_dir=args.download_dir, mirror=args.mirror,
                                          checksums=checksum_overrides(args.checksum), overwrite=args.overwrite,
                                          progress=not args.no_progress))


if __name__ == "__main__":
    sys.exit(main())
