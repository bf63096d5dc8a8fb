"""full (B0): every position is kept; the sparse canonical form of the dense cache."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method


@dataclass(frozen=True)
class Full(Method):
    name = "full"
    description = "Every position is kept: the dense baseline in the sparse cache's form"
    paper = "none: the uncompressed cache, the baseline every method is measured against"
    keeps_everything = True
    shared_across_heads = True

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        return mx.ones((obs.n_kv_heads, obs.n_tokens), mx.float32)
