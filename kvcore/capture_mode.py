"""Which h2o capture a prefill runs when asked for "auto": eager sums on a GPU, kept queries on a CPU (issue 15).

On a CPU MLX's `exp` is slow (~25 M/s), so computing h2o's column sums during the prefill would cost far more than
the prefill itself; keeping the queries and computing the sums only when h2o is asked for is faster there. On a GPU
the sums are cheap next to the prefill and the kept queries (H_q/(2·H_kv) × the dense cache) are what costs, so
the sums are computed chunk by chunk as the prefill goes. `KVLENS_H2O_CAPTURE=eager|lazy` overrides the choice.
"""

from __future__ import annotations

import logging
import os

import mlx.core as mx

from kvcore.defaults import H2O_CAPTURE_ENV, H2O_CAPTURE_MODES

log = logging.getLogger("kvcore")


def resolve(mode: str) -> tuple[str, str]:
    """("eager" or "lazy", why) for a capture mode of `H2O_CAPTURE_MODES`; "auto" reads the env, then the backend."""
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
    if device.type == mx.gpu:
        return "eager", f"default device {device} is a GPU: the sums are cheap there, kept queries are not"
    return (
        "lazy",
        f"default device {device} is a CPU: its exp is slow, so the sums wait until h2o is asked for",
    )
