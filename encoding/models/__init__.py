"""encoding.models (work in progress)."""
