"""tova (Oren et al. 2024): the last prompt query's attention, averaged over all query heads."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, window_attention


@dataclass(frozen=True)
class TOVA(Method):
    name = "tova"
    description = "The last prompt query's attention, averaged over all heads; every kv-head keeps the same"
    paper = "Transformers are Multi-State RNNs (TOVA, Oren et al. 2024), arXiv:2401.06104"
    shared_across_heads = True

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        last = window_attention(obs, 1)[:, 0].mean(axis=0)  # [T], over all H_q heads
        return mx.broadcast_to(last, (obs.n_kv_heads, obs.n_tokens))

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return np.array([n_tokens - 1])
