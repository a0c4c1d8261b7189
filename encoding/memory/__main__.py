"""``python -m encoding.memory``: the memory tool (options: ``python -m encoding.memory --help``)."""
import sys

from .cli import cli

if __name__ == "__main__":
    sys.exit(cli())
