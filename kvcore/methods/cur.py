"""cur (CurDKV, Sengupta et al. 2025, arXiv 2509.15038; kvpress's CURPress): keys and values leverage combined.

Per kv-head and position, k2 = ‖k‖² and v2 = ‖v‖² (cached keys: RoPE keeps norms), optionally after a shared
random projection to 20 dimensions (`use_random_leverage`). With `use_local_approximation` each is divided by its
sum over consecutive windows of `local_window_size` positions (the last window zero-padded). `leverage_type`
combines them: 0 k2, 1 v2, 2 (k2 + v2)/2, 3 k2·v2; the result is divided by its sum over the prompt and the first
`num_sinks` positions score 1, above every other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, param

#: kvpress's width of the random projection (use_random_leverage).
RANDOM_WIDTH = 20
LEVERAGE_TYPES = ("key", "value", "kv_avg", "kv_product")


def local_share(x: mx.array, window: int) -> mx.array:
    """x [H, T] divided by its sum over consecutive windows of `window` positions (the last one shorter)."""
    n_heads, n_tokens = x.shape
    padded = mx.pad(x, [(0, 0), (0, -n_tokens % window)]).reshape(n_heads, -1, window)
    return (padded / padded.sum(axis=-1, keepdims=True)).reshape(n_heads, -1)[:, :n_tokens]


@dataclass(frozen=True)
class Cur(Method):
    name = "cur"
    description = (
        "CurDKV: key and value leverage (squared norms, shared per local window) combined; sinks kept"
    )
    paper = (
        "CurDKV: Value-Guided KV Compression for LLMs via Approximated CUR Decomposition (2025), "
        "arXiv:2509.15038"
    )

    num_sinks: int = param(4, "attention sinks: the first positions, always kept", minimum=0)
    leverage_type: int = param(
        3, "0: keys' leverage, 1: values', 2: their mean, 3: their product", minimum=0, maximum=3
    )
    use_random_leverage: int = param(
        0, "1: project keys and values on a random 20-column Gaussian matrix first", minimum=0, maximum=1
    )
    use_local_approximation: int = param(
        1, "1: normalise each leverage within windows of local_window_size positions", minimum=0, maximum=1
    )
    local_window_size: int = param(16, "positions per window of the local approximation", minimum=1)
    sketch_seed: int = param(
        0, "seed of the random projection (NumPy's generator, with the layer index)", minimum=0
    )

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        if obs.values is None:
            raise ValueError(
                "cur scores keys and values; a latent (MLA) layer caches no values: choose another method"
            )
        keys, values = obs.keys.astype(mx.float32), obs.values.astype(mx.float32)
        if self.use_random_leverage:
            rng = np.random.default_rng([self.sketch_seed, layer])
            draw = rng.standard_normal((keys.shape[-1], RANDOM_WIDTH)).astype(np.float32)
            projection = mx.array(draw * np.float32(1 / math.sqrt(RANDOM_WIDTH)))
            keys, values = keys @ projection, values @ projection
        k2, v2 = (keys * keys).sum(axis=-1), (values * values).sum(axis=-1)
        if self.use_local_approximation:
            k2, v2 = local_share(k2, self.local_window_size), local_share(v2, self.local_window_size)
        combined = (k2, v2, (k2 + v2) / 2, k2 * v2)[self.leverage_type]
        combined = combined / combined.sum(axis=-1, keepdims=True)
        n_sink = min(self.num_sinks, obs.n_tokens)
        sinks = mx.ones((combined.shape[0], n_sink), mx.float32)
        return mx.concatenate([sinks, combined[:, n_sink:]], axis=1)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return np.arange(min(self.num_sinks, n_tokens))
