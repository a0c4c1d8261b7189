"""``python -m encoding.memory``: the memory tool (options: ``python -m encoding.memory --help``)."""
from .cli import main

if __name__ == "__main__":
    main()
