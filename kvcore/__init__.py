"""kvcore: the Qt-free KV-cache compression engine behind KV Lens."""

from kvcore.blas import load_optimized_blas

load_optimized_blas()

__version__ = "0.1.0"
