"""lagkv (Liang et al. 2025, kvpress's LagKVPress): each partition of the prompt scored against the next one.

After `n_sink` sinks the prompt is cut into partitions of `lag_size`; the last whole partition and the remainder
(the tail) are kept, as are the sinks. A token of partition p is normalised per channel by the min and max of
partition p + 1 (its lag reference); its score is the softmax over the partition of the channels' standard deviation
of that normalised row, averaged over keys and values. Without `cross_scoring` the scores become ranks within the
partition (rank / lag_size), so every partition keeps its share. A prompt shorter than n_sink + 2·lag_size is not
compressed by kvpress: the sinks score 1 and the rest a recency ramp.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, n_sink_param, param


def _lag_scores(x: mx.array, lag_size: int) -> mx.array:
    """[H, P, lag, D] partitions -> [H, P - 1, lag]: the first P - 1 scored against their successors."""
    ref, rows = x[:, 1:], x[:, :-1]
    low = ref.min(axis=-2, keepdims=True)
    high = ref.max(axis=-2, keepdims=True)
    normalised = (rows - low) / (high - low)
    mean = normalised.mean(axis=-1, keepdims=True)
    std = mx.sqrt(((normalised - mean) ** 2).sum(axis=-1) / (x.shape[-1] - 1))  # unbiased, as torch's std
    return mx.softmax(std, axis=-1, precise=True)


@dataclass(frozen=True)
class LagKV(Method):
    name = "lagkv"
    description = (
        "Each partition of the prompt scored by its K/V spread against the next partition (lag-relative)"
    )
    paper = (
        "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are Important (2025), "
        "arXiv:2504.04704"
    )
    scores_from_cache = True

    n_sink: int = n_sink_param()
    lag_size: int = param(128, "partition length: each partition is scored against the next one", minimum=1)
    cross_scoring: int = param(
        0,
        "1: compare raw scores across partitions (experimental); 0: rank within each partition",
        minimum=0,
        maximum=1,
    )

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        if obs.values is None:
            raise ValueError(
                "lagkv scores keys and values; a latent (MLA) layer caches no values: choose another method"
            )
        keys, values = obs.keys.astype(mx.float32), obs.values.astype(mx.float32)
        n_heads, n_tokens, _ = keys.shape
        sink, lag = self.n_sink, self.lag_size
        if n_tokens < sink + 2 * lag:
            ramp = mx.arange(max(n_tokens - sink, 0), dtype=mx.float32) / max(n_tokens - sink, 1)
            row = mx.concatenate([mx.ones(min(sink, n_tokens), mx.float32), ramp])
            return mx.broadcast_to(row, (n_heads, n_tokens))
        end = sink + ((n_tokens - sink) // lag) * lag
        parts = (end - sink) // lag

        def partitioned(x: mx.array) -> mx.array:
            return x[:, sink:end].reshape(n_heads, parts, lag, x.shape[-1])

        score = (_lag_scores(partitioned(keys), lag) + _lag_scores(partitioned(values), lag)) / 2
        if not self.cross_scoring:
            score = mx.argsort(mx.argsort(score, axis=-1), axis=-1).astype(mx.float32) / lag
        tail = n_tokens - end + lag
        return mx.concatenate(
            [mx.ones((n_heads, sink)), score.reshape(n_heads, -1), mx.ones((n_heads, tail))], axis=1
        )
