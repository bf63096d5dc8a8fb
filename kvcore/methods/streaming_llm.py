"""streaming_llm (Xiao et al. 2023): the first `n_sink` positions (attention sinks) plus the most recent ones."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, n_sink_param


@dataclass(frozen=True)
class StreamingLLM(Method):
    name = "streaming_llm"
    description = "The first positions (attention sinks) and the most recent ones"
    paper = "Efficient Streaming Language Models with Attention Sinks (Xiao et al. 2023), arXiv:2309.17453"
    shared_across_heads = True

    n_sink: int = n_sink_param()

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        """Recency: later positions score higher; the sinks come first through `always_kept`."""
        recency = mx.arange(obs.n_tokens, dtype=mx.float32) / obs.n_tokens
        return mx.broadcast_to(recency, (obs.n_kv_heads, obs.n_tokens))

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return np.arange(min(self.n_sink, n_tokens))
