"""streaming_llm (Xiao et al. 2023): the first `n_sink` positions (attention sinks) plus the most recent ones."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, MethodParams


class StreamingLLM(Method):
    name = "streaming_llm"
    shared_across_heads = True

    def scores(self, obs: LayerObservation, layer: int, params: MethodParams) -> mx.array:
        """Recency: later positions score higher; the sinks come first through `always_kept`."""
        recency = mx.arange(obs.n_tokens, dtype=mx.float32) / obs.n_tokens
        return mx.broadcast_to(recency, (obs.n_kv_heads, obs.n_tokens))

    def always_kept(self, n_tokens: int, params: MethodParams) -> np.ndarray:
        return np.arange(min(params.n_sink, n_tokens))
