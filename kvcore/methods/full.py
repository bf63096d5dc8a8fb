"""full (B0): every position is kept; the sparse canonical form of the dense cache."""

from __future__ import annotations

import mlx.core as mx

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, MethodParams


class Full(Method):
    name = "full"
    keeps_everything = True
    shared_across_heads = True

    def scores(self, obs: LayerObservation, layer: int, params: MethodParams) -> mx.array:
        return mx.ones((obs.n_kv_heads, obs.n_tokens), mx.float32)
