"""expected_attention (kvpress's ExpectedAttentionPress): the attention future queries are expected to pay.

The first `n_sink` positions are always kept and left out. From the pre-RoPE queries of every prompt position
after them (statistics recorded at prefill, `kvcore.capture.query_stats`), per query head the mean μ and covariance Σ;
R̄ = the mean of the model's own RoPE matrices at positions T … T + 511; μ' = R̄μ, Σ' = R̄ΣR̄ᵀ. For a query
q ~ N(μ', Σ'), E[exp(q·k/√d)] = exp(k·μ'/√d + kᵀΣ'k/(2d)), so score = softmax over the non-sink keys of that
exponent, mean over the GQA group, plus `attention_epsilon` (kvpress's epsilon, default 0;
named apart from criticalkv's, which wraps it), times ‖v‖₂. Sinks score the layer's
maximum + 1, as in kvpress.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import BLOCK_ELEMENTS, LayerObservation
from kvcore.declared import param
from kvcore.defaults import QUERY_STATS_HEAD
from kvcore.methods.base import Method, n_sink_param


def expected_attention_scores(obs: LayerObservation, n_sink: int, epsilon: float = 0.0) -> mx.array:
    """Scores [H_kv, T] float32 (module docstring)."""
    if obs.latent:
        raise ValueError(
            "expected_attention does not score multi-head latent attention (MLA) layers: choose another method"
        )
    stats = obs.query_stats
    rot = None if stats is None else stats.mean_rotation()
    if stats is None or rot is None or obs.values is None:
        raise ValueError(
            "expected_attention needs the pre-RoPE query statistics recorded at prefill; this layer's queries "
            "did not pass through a `rope` module KV Lens could tap: prefill again with query_stats=True, "
            "or choose another method for this model"
        )
    n_sink = min(n_sink, obs.n_tokens)
    if n_sink >= obs.n_tokens:
        return mx.ones((obs.n_kv_heads, obs.n_tokens), mx.float32)
    _, mean, cov = stats.moments(n_sink)
    return scores_from_moments(obs, n_sink, mean, cov, rot, epsilon)


def scores_from_moments(
    obs: LayerObservation, n_sink: int, mean: mx.array, cov: mx.array, rot: mx.array, epsilon: float = 0.0
) -> mx.array:
    """Scores [H_kv, T] from pre-RoPE query moments (mean [H_q, D], covariance [H_q, D, D]) and R̄ [D, D], wherever
    the moments come from (the prompt, or a calibration set: expected_attention_stats); n_sink < T."""
    mean = mean @ rot.T  # [H_q, D]: R̄μ per head
    cov = rot @ cov @ rot.T  # [H_q, D, D]
    keys = obs.keys[:, n_sink:].astype(mx.float32)  # [H_kv, T', D]
    n_kv, group, head_dim = obs.n_kv_heads, obs.group, keys.shape[-1]
    mean = mean.reshape(n_kv, group, 1, head_dim)
    cov = cov.reshape(n_kv, group, head_dim, head_dim)
    block = max(1, BLOCK_ELEMENTS // (obs.n_q_heads * head_dim))
    logits = []
    for start in range(0, keys.shape[1], block):
        k = keys[:, None, start : start + block]  # [H_kv, 1, b, D]
        linear = (k * mean).sum(axis=-1) / math.sqrt(head_dim)
        quadratic = ((k @ cov) * k).sum(axis=-1) / (2 * head_dim)
        logits.append(linear + quadratic)  # [H_kv, group, b]
    probs = mx.softmax(mx.concatenate(logits, axis=-1), axis=-1, precise=True).mean(axis=1)
    values = obs.values[:, n_sink:].astype(mx.float32)
    scores = (probs + epsilon) * mx.sqrt((values * values).sum(axis=-1))
    sinks = mx.broadcast_to(scores.max() + 1, (n_kv, n_sink))
    return mx.concatenate([sinks, scores], axis=1)


@dataclass(frozen=True)
class ExpectedAttention(Method):
    name = "expected_attention"
    description = "The attention future queries are expected to pay, from the prompt's query statistics"
    paper = (
        "Expected Attention: KV Cache Compression by Estimating Attention from Future Queries Distribution "
        "(Devoto et al. 2025), arXiv:2510.00636"
    )
    needs_query_stats = True

    #: Capture keeps the first QUERY_STATS_HEAD positions' queries one by one, so the sinks can go up to that.
    n_sink: int = n_sink_param(maximum=QUERY_STATS_HEAD)
    attention_epsilon: float = param(
        0.0, "added to each expected attention before it is scaled by ‖v‖₂ (kvpress's epsilon)", minimum=0.0
    )

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        return expected_attention_scores(obs, self.n_sink, self.attention_epsilon)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return np.arange(min(self.n_sink, n_tokens))
