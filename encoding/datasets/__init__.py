"""encoding.datasets (work in progress)."""
