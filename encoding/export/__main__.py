"""``python -m encoding.export``: see :mod:`encoding.export.cli`."""
import sys

from .cli import cli

sys.exit(cli())
