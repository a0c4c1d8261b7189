"""``python -m encoding.app``: the web page (options: ``python -m encoding.app --help``)."""
import sys

from .cli import cli

if __name__ == "__main__":
    sys.exit(cli())
