"""``python -m encoding.datasets.prepare NAME [options]`` (see :mod:`encoding.datasets.prepare.cli`)."""
import sys

from .cli import main

if __name__ == "__main__":  # importing this module (documentation tools walking the package) runs nothing
    sys.exit(main())
