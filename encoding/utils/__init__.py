"""encoding.utils (work in progress)."""
from . import files  # noqa: F401
