"""The error of a setting a run cannot use."""
from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """An option value the run cannot use, found before any work: one line naming the option and the value (exit
    status 2 on the command line, as an argument error)."""

    exit_status = 2
