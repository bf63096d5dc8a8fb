"""kvcore: the Qt-free KV-cache compression engine behind KV Lens."""

from kvcore.blas import load_optimized_blas

load_optimized_blas()

from kvcore.cache_io import load_cache, save_cache  # noqa: E402
from kvcore.caches import (  # noqa: E402
    SparseKVCache,
    SparseQuantizedKVCache,
    cache_tensor_bytes,
    compressible_layers,
    copy_cache,
    dense_bytes_formula,
    incompressible_reason,
    quantize_cache,
    select_positions,
    to_sparse_all,
)

__version__ = "0.1.0"

__all__ = [
    "SparseKVCache",
    "SparseQuantizedKVCache",
    "cache_tensor_bytes",
    "compressible_layers",
    "copy_cache",
    "dense_bytes_formula",
    "incompressible_reason",
    "load_cache",
    "quantize_cache",
    "save_cache",
    "select_positions",
    "to_sparse_all",
]
