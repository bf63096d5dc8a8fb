"""Load an optimized BLAS before mlx on Linux.

The `mlx[cpu]` wheel bundles a reference BLAS (about 5 GFLOP/s for a 1024² fp32 matmul); loading OpenBLAS
globally first makes mlx resolve its BLAS symbols there instead (64–82 GFLOP/s, identical results). Macs use
Accelerate and need nothing. This module must be imported before `mlx`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger("kvcore")

_CANDIDATES = ("libopenblas.so.0", "libopenblas.so", "libopenblasp-r0.so")

#: Which BLAS kvcore arranged for mlx: "accelerate", "openblas (<path>)", or "reference (bundled)".
BLAS_IN_USE = "unknown"


def load_optimized_blas() -> str:
    """Load OpenBLAS with RTLD_GLOBAL on Linux (unless KVLENS_NO_OPENBLAS=1); return what is in use."""
    global BLAS_IN_USE
    if BLAS_IN_USE != "unknown":
        return BLAS_IN_USE
    if sys.platform == "darwin":
        BLAS_IN_USE = "accelerate"
    elif os.environ.get("KVLENS_NO_OPENBLAS") == "1":
        BLAS_IN_USE = "reference (bundled; KVLENS_NO_OPENBLAS=1)"
    else:
        if "mlx.core" in sys.modules:
            log.warning("mlx was imported before kvcore: OpenBLAS may not take effect")
        BLAS_IN_USE = "reference (bundled; install Debian's libopenblas0 for ~10x faster matmul)"
        names = list(_CANDIDATES)
        found = ctypes.util.find_library("openblas")
        if found:
            names.append(found)
        for name in names:
            try:
                ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            BLAS_IN_USE = f"openblas ({name})"
            break
    log.info("BLAS in use: %s", BLAS_IN_USE)
    return BLAS_IN_USE
