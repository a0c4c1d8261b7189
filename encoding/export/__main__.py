"""``python -m encoding.export``: see :mod:`encoding.export.cli`."""
import sys

from .cli import cli

if __name__ == "__main__":  # importing this module runs nothing
    sys.exit(cli())
