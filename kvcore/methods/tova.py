"""tova (Oren et al. 2024): the last prompt query's attention, averaged over all query heads."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, MethodParams, window_attention


class TOVA(Method):
    name = "tova"
    shared_across_heads = True

    def scores(self, obs: LayerObservation, layer: int, params: MethodParams) -> mx.array:
        last = window_attention(obs, 1)[:, 0].mean(axis=0)  # [T], over all H_q heads
        return mx.broadcast_to(last, (obs.n_kv_heads, obs.n_tokens))

    def always_kept(self, n_tokens: int, params: MethodParams) -> np.ndarray:
        return np.array([n_tokens - 1])
