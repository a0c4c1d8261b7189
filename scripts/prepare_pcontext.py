#!/usr/bin/env python
"""Download VOC 2010 + PASCAL-Context's trainval_merged.json and convert them to 59-class label PNGs (pcontext).

Example:
    python scripts/prepare_pcontext.py --root /data
"""
import sys
from typing import List, Optional

from encoding.datasets.pcontext import prepare_pcontext
from encoding.datasets.resources import checksum_overrides, prepare_argument_parser, run_cli


def main(argv: Optional[List[str]] = None) -> int:
    args = prepare_argument_parser(__doc__).parse_args(argv)
    return run_cli(lambda: prepare_pcontext(args.root, download_dir=args.download_dir, mirror=args.mirror,
                                            checksums=checksum_overrides(args.checksum), overwrite=args.overwrite,
                                            progress=not args.no_progress))


if __name__ == "__main__":
    sys.exit(main())
