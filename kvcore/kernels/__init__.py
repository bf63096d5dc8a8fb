"""Hand-written kernels for MLX's CUDA backend, used where MLX 0.32 has no fused operation (issue 15).

Each kernel is one file and has an MLX-operations path beside it that gives the same result: the kernels run only
when `cuda_ready()` (the default device is a CUDA GPU) and `KVLENS_FUSED_KERNELS` is not "0"; everywhere else (the
CPU, Metal) the operations path runs unchanged. Their correctness against that path is checked on a GPU by
`benchmarks/gpu_kernels.py`, which CI cannot run (it has no GPU).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx

from kvcore.defaults import FUSED_KERNELS_ENV

#: The widest head (elements per key or value row) either kernel is written for; wider heads take the
#: MLX-operations path.
MAX_HEAD_DIM = 256


def cuda_ready() -> bool:
    """True when the default device is a CUDA GPU and the kernels are not switched off by the environment.

    The device first: on a CPU this answers in ~0.1 µs (it runs per ragged layer and decode step)."""
    if mx.default_device().type != mx.gpu or not mx.cuda.is_available():
        return False
    return os.environ.get(FUSED_KERNELS_ENV, "").strip() != "0"


def float_literal(x: float) -> str:
    """`x` as a CUDA float literal that round-trips (a scale baked into a kernel's source)."""
    return f"{float(x)!r}f"


def scale_source(scale: float) -> tuple[str, str]:
    """(a kernel-name tag for `scale`, the source line defining SCALE_LOG2 = scale · log2(e)): the kernels work in
    base 2 and bake the scale in; the tag keeps one compiled kernel per scale (a model has one)."""
    tag = float_literal(scale).replace(".", "p").replace("-", "m").rstrip("f")
    return tag, f"    constexpr float SCALE_LOG2 = {float_literal(scale * 1.4426950408889634)};\n"


@contextmanager
def switched(on: bool) -> Iterator[None]:
    """Kernels on (where they apply) or off inside the block: benchmarks run both paths side by side in one run."""
    old = os.environ.get(FUSED_KERNELS_ENV)
    os.environ[FUSED_KERNELS_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(FUSED_KERNELS_ENV, None)
        else:
            os.environ[FUSED_KERNELS_ENV] = old
