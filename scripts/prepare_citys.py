#!/usr/bin/env python
"""Prepare Cityscapes (citys) from the two packages downloaded by hand (the site needs a login).

Without --zips this prints the download instructions. With it, the zips are verified (if --checksum is given) and
extracted into <root>/citys, all or nothing.

Example:
    python scripts/prepare_citys.py --zips ~/Downloads
"""
import sys
from typing import List, Optional

from encoding.datasets.cityscapes import INSTRUCTIONS, prepare_citys
from encoding.datasets.resources import checksum_overrides, prepare_argument_parser, run_cli


def main(argv: Optional[List[str]] = None) -> int:
    parser = prepare_argument_parser(__doc__, downloads=False)
    parser.add_argument("--zips", default=None,
                        help="folder holding gtFine_trainvaltest.zip and leftImg8bit_trainvaltest.zip")
    args = parser.parse_args(argv)
    if args.zips is None:
        print(INSTRUCTIONS)
        return 2
    return run_cli(lambda: prepare_citys(args.root, zips=args.zips, checksums=checksum_overrides(args.checksum),
                                         overwrite=args.overwrite, progress=not args.no_progress))


if __name__ == "__main__":
    sys.exit(main())
