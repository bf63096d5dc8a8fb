"""compactor (Chari & Van Durme 2025, arXiv 2507.08143; kvpress's CompactorPress): leverage blended with attention.

The first `sink_size_start` and last `sink_size_end` positions are kept and left out; on the positions between,
score = blending · leverage + non_causal_attention, each z-scored over that span as its own method scores it
(chunks counted from the first non-sink position), and the sinks score the layer's maximum, as in kvpress.
`blending` −1 (the default) follows kvpress: the compression ratio 1 − r of the compression asked for (0.35 when
scored without a ratio, kvpress's fallback).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, param
from kvcore.methods.leverage import Leverage, z_scored
from kvcore.methods.non_causal_attention import non_causal_scores, prompt_queries
from kvcore.methods.pre_rope import pre_rope_keys

#: `blending` that stands for kvpress's default, the compression ratio; and kvpress's value without a ratio.
BLENDING_FROM_RATIO, BLENDING_WITHOUT_RATIO = -1.0, 0.35


@dataclass(frozen=True)
class Compactor(Method):
    name = "compactor"
    description = (
        "Leverage of pre-RoPE keys blended with chunked non-causal attention; sinks kept at both ends"
    )
    paper = (
        "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage Scores (Chari & "
        "Van Durme 2025), arXiv:2507.08143"
    )

    sink_size_start: int = param(8, "first positions, always kept", minimum=0)
    sink_size_end: int = param(4, "last positions, always kept", minimum=0)
    chunk_size: int = param(256, "positions per chunk of the non-causal attention", minimum=1)
    sketch_dimension: int = param(48, "columns of the Gaussian sketch of the keys", minimum=1)
    blending: float = param(
        BLENDING_FROM_RATIO,
        "weight of the leverage scores; -1: the compression ratio 1 - r (kvpress's default)",
        minimum=BLENDING_FROM_RATIO,
    )
    sketch_seed: int = param(0, "seed of the sketch (NumPy's generator, with the layer index)", minimum=0)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.blending < 0 and self.blending != BLENDING_FROM_RATIO:
            raise ValueError(f"blending must be >= 0, or -1 for the compression ratio, got {self.blending!r}")

    def at_ratio(self, ratio: float) -> Method:
        if self.blending != BLENDING_FROM_RATIO:
            return self
        return dataclasses.replace(self, blending=1.0 - ratio)

    def _ends(self, n_tokens: int) -> tuple[int, int]:
        left = min(self.sink_size_start, n_tokens)
        return left, min(self.sink_size_end, max(0, n_tokens - left))

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        queries = prompt_queries(obs, self.name)
        if obs.values is None:
            raise ValueError(f"{self.name} weighs by the values, which a latent (MLA) layer does not cache")
        n_tokens = obs.n_tokens
        left, right = self._ends(n_tokens)
        stop = n_tokens - right
        if stop <= left:
            return mx.ones((obs.n_kv_heads, n_tokens), mx.float32)
        keys_pre = pre_rope_keys(obs, self.name)[:, left:stop]
        sketch = Leverage(sketch_dimension=self.sketch_dimension, sketch_seed=self.sketch_seed)
        leverage = z_scored(sketch.raw_scores(keys_pre, layer))
        keys, values = obs.keys[:, left:stop].astype(mx.float32), obs.values[:, left:stop].astype(mx.float32)
        attention = non_causal_scores(queries[:, left:stop], keys, values, obs.n_kv_heads, self.chunk_size)
        blending = BLENDING_WITHOUT_RATIO if self.blending == BLENDING_FROM_RATIO else self.blending
        middle = blending * leverage + attention
        top = middle.max()
        return mx.concatenate(
            [
                mx.broadcast_to(top, (obs.n_kv_heads, left)),
                middle,
                mx.broadcast_to(top, (obs.n_kv_heads, right)),
            ],
            axis=1,
        )

    def always_kept(self, n_tokens: int) -> np.ndarray:
        left, right = self._ends(n_tokens)
        return np.concatenate([np.arange(left), np.arange(n_tokens - right, n_tokens)]).astype(np.int64)
