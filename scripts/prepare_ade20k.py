#!/usr/bin/env python
"""Download ADE20K (ADEChallengeData2016, ~923 MB) and extract it into the data root.

Example:
    python scripts/prepare_ade20k.py                      # into $ENCODING_DATA or ~/.encoding/data
    python scripts/prepare_ade20k.py --mirror /mnt/archives --with-test
"""
import sys
from typing import List, Optional

from encoding.datasets.ade20k import prepare_ade20k
from encoding.datasets.resources import checksum_overrides, prepare_argument_parser, run_cli


def main(argv: Optional[List[str]] = None) -> int:
    parser = prepare_argument_parser(__doc__)
    parser.add_argument("--with-test", action="store_true", help="also fetch the unlabelled test images")
    args = parser.parse_args(argv)
    return run_cli(lambda: prepare_ade20k(args.root, download_dir=args.download_dir, mirror=args.mirror,
                                          checksums=checksum_overrides(args.checksum), with_test=args.with_test,
                                          overwrite=args.overwrite, progress=not args.no_progress))


if __name__ == "__main__":
    sys.exit(main())
