"""encoding.parallel (being written)."""
from .reduction import *  # noqa: F401,F403
