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
    "load_cache": "kvcore.cache_io",
    "save_cache": "kvcore.cache_io",
    "SparseKVCache": "kvcore.caches",
    "SparseQuantizedKVCache": "kvcore.caches",
    "cache_tensor_bytes": "kvcore.caches",
    "compressible_layers": "kvcore.caches",
    "copy_cache": "kvcore.caches",
    "dense_bytes_formula": "kvcore.caches",
    "incompressible_reason": "kvcore.caches",
    "quantize_cache": "kvcore.caches",
    "select_positions": "kvcore.caches",
    "to_sparse_all": "kvcore.caches",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kvcore' has no attribute {name!r}")
