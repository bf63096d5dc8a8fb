"""PyInstaller runtime hook for KV Lens; runs in the frozen app before any of its own imports.

MLX loads its Metal kernels from the `mlx.metallib` that sits in the same folder as the `libmlx.dylib`
dyld loaded (found with dladdr). In the bundle the real library is `mlx/lib/libmlx.dylib`, next to the
metallib, but `mlx/core.so` reaches it through a top-level symlink. Loading the real path first makes dyld
(which does not load one file twice) use that image, so dladdr reports `mlx/lib/` and the kernels are found.
packaging/kvlens.spec also adds a top-level symlink to the metallib for the case this does not cover.
"""

import ctypes
import os
import sys

if sys.platform == "darwin" and getattr(sys, "frozen", False):
    _libmlx = os.path.join(sys._MEIPASS, "mlx", "lib", "libmlx.dylib")
    if os.path.isfile(_libmlx):
        try:
            ctypes.CDLL(_libmlx, mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:  # leave it to `import mlx.core` to report
            print(f"kvlens: could not preload {_libmlx}: {exc}", file=sys.stderr)
