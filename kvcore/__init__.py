"""kvcore: the Qt-free KV-cache compression engine behind KV Lens.

OpenBLAS is loaded before anything imports mlx (`kvcore.blas`). The cache API is re-exported lazily so that
MLX-free parts (`kvcore.probes`, used by the training script on a machine without MLX) import without mlx.
"""

from importlib import import_module
from typing import Any

from kvcore.blas import load_optimized_blas

load_optimized_blas()

__version__ = "0.1.0"

_EXPORTS = {
    "load_cache": "kvcore.cache.files",
    "save_cache": "kvcore.cache.files",
    "SparseKVCache": "kvcore.cache.sparse",
    "SparseQuantizedKVCache": "kvcore.cache.sparse",
    "cache_tensor_bytes": "kvcore.cache.sparse",
    "compressible_layers": "kvcore.cache.sparse",
    "copy_cache": "kvcore.cache.sparse",
    "dense_bytes_formula": "kvcore.cache.sparse",
    "incompressible_reason": "kvcore.cache.sparse",
    "quantize_cache": "kvcore.cache.sparse",
    "select_positions": "kvcore.cache.sparse",
    "to_sparse_all": "kvcore.cache.sparse",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kvcore' has no attribute {name!r}")
