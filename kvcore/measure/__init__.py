"""Quality metrics against the dense cache, the memory-quality frontier, CSV/JSON export."""
