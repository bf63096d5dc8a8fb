"""Which h2o capture a prefill runs when asked for "auto": kept queries (lazy) while they fit, else eager sums.

Lazy keeps each chunk's queries (H_q/(2·H_kv) × the dense cache in bf16) and computes h2o's column sums only when
h2o is asked for; eager computes them as the prefill goes and keeps none. On a CPU MLX's `exp` is slow (~25 M/s),
so eager would cost far more than the prefill: lazy there. On a GPU eager sums were expected to be cheap, but the
H200 measured otherwise (issue 15): materialising every query's softmax row with MLX's operations costs 2.8× a
plain prefill at 8k and 12× at 32k, while lazy costs 1.0×. On CUDA, kvcore's own kernels (`kvcore.kernels.h2o_sums`)
compute the sums without writing a score, so CUDA is eager; any other GPU (Metal) keeps the queries while they take
at most LAZY_QUERY_SHARE of the free memory (an 8B model at 32k: 8.6 GB of 116 GB on an H200) and computes eager
sums only where they would not fit (the same model on a 32 GB Mac). `KVLENS_H2O_CAPTURE=eager|lazy` overrides the
choice.
"""

from __future__ import annotations

import logging
import os

import mlx.core as mx

from kvcore import kernels
from kvcore.defaults import H2O_CAPTURE_ENV, H2O_CAPTURE_MODES, LAZY_QUERY_SHARE

log = logging.getLogger("kvcore")


def resolve(mode: str, kept_query_bytes: int | None = None) -> tuple[str, str]:
    """("eager" or "lazy", why) for a capture mode of `H2O_CAPTURE_MODES`; "auto" reads the env, then the backend
    and, on a GPU, whether `kept_query_bytes` (what lazy would keep; None: unknown) fit in the free memory."""
    if mode not in H2O_CAPTURE_MODES:
        raise ValueError(f"h2o capture mode must be one of {', '.join(H2O_CAPTURE_MODES)}, got {mode!r}")
    if mode != "auto":
        return mode, "asked for"
    env = os.environ.get(H2O_CAPTURE_ENV, "").strip()
    if env:
        if env not in ("eager", "lazy"):
            raise ValueError(f"{H2O_CAPTURE_ENV}={env!r}: set it to eager or lazy, or unset it for auto")
        return env, f"{H2O_CAPTURE_ENV}={env}"
    device = mx.default_device()
    if kernels.cuda_ready():
        return "eager", (
            "on CUDA the fused kernels (kvcore.kernels.h2o_sums) sum as the prefill goes, without writing a score: "
            "no prefill queries kept"
        )
    if device.type == mx.gpu:
        return on_gpu(kept_query_bytes, mx.get_memory_limit() - mx.get_active_memory())
    return (
        "lazy",
        f"default device {device} is a CPU: its exp is slow, so the sums wait until h2o is asked for",
    )


def on_gpu(kept_query_bytes: int | None, free_bytes: int) -> tuple[str, str]:
    """The GPU's choice: lazy while the kept queries take at most LAZY_QUERY_SHARE of the free memory."""
    if kept_query_bytes is None:
        return (
            "eager",
            "on a GPU, with the size of the prefill queries unknown: sums computed as the prefill goes",
        )
    need, free = kept_query_bytes / 2**30, max(free_bytes, 0) / 2**30
    if kept_query_bytes <= LAZY_QUERY_SHARE * max(free_bytes, 0):
        return "lazy", (
            f"on a GPU with room: the prefill queries ({need:.2f} GiB of {free:.1f} GiB free) are kept, which costs "
            "less time than eager sums"
        )
    return "eager", (
        f"on a GPU, the prefill queries ({need:.2f} GiB) would take more than {LAZY_QUERY_SHARE:.0%} of the "
        f"{free:.1f} GiB free: sums computed as the prefill goes"
    )
