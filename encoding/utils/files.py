"""Download / verify / extract helpers (work in progress)."""
__all__ = []
