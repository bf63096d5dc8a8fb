"""cap (CAPKV, arXiv 2604.25975; kvpress's CapPress): query-aware capacity of each value, a log-determinant gain.

The first `n_sink` positions are kept and left out. Per query head, the anchor μ is the mean of the pre-RoPE
queries of positions n_sink … T−1 (prefill's query statistics) rotated by R̄, the mean RoPE matrix of positions
T … T+511. A key's weight is w = exp(τ·(c − max c)), c its cosine to μ (kvpress normalises both); with
A = I + Σ (w + ε) v vᵀ, its score is w · vᵀA⁻¹v (the value's leverage in the weighted capacity matrix), averaged
over the GQA group. Sinks score the layer's maximum + 1, as in kvpress.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.defaults import QUERY_STATS_HEAD
from kvcore.methods.base import Method, n_sink_param, param

#: torch's F.normalize floors the norms at this.
_EPS_NORMALIZE = 1e-12


def _unit(x: mx.array) -> mx.array:
    return x / mx.maximum(mx.sqrt((x * x).sum(axis=-1, keepdims=True)), _EPS_NORMALIZE)


@dataclass(frozen=True)
class Cap(Method):
    name = "cap"
    description = (
        "Capacity gain of each value under query-aligned weights (log-determinant leverage); sinks kept"
    )
    paper = (
        "CAPKV as kvpress cites it (query-aware capacity, a log-determinant leverage proxy), arXiv:2604.25975"
    )
    needs_query_stats = True

    tau: float = param(5.0, "temperature of the query-key alignment weights", minimum=0.0)
    #: Capture keeps the first QUERY_STATS_HEAD positions' queries one by one, so the sinks can go up to that.
    n_sink: int = n_sink_param(maximum=QUERY_STATS_HEAD)
    weight_epsilon: float = param(
        1e-6, "added to the weights before their square root (stability; kvpress's epsilon)", minimum=0.0
    )

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        stats = obs.query_stats
        rot = None if stats is None else stats.mean_rotation()
        if obs.latent or obs.values is None:
            raise ValueError(
                "cap does not score multi-head latent attention (MLA) layers: choose another method"
            )
        if stats is None or rot is None:
            raise ValueError(
                "cap needs the pre-RoPE query statistics recorded at prefill; this layer's queries did not pass "
                "through a `rope` module KV Lens could tap: prefill again, or choose another method for this model"
            )
        n_tokens, n_sink = obs.n_tokens, self.n_sink
        if n_tokens <= n_sink:
            raise ValueError(
                f"cap needs a prompt longer than n_sink={n_sink}, got {n_tokens} tokens: lower n_sink"
            )
        _, mean, _ = stats.moments(n_sink)
        anchor = _unit(mean @ rot.T)  # [H_q, D]
        n_kv, group = obs.n_kv_heads, obs.group
        keys = mx.repeat(obs.keys[:, n_sink:].astype(mx.float32), group, axis=0)  # [H_q, T', D]
        values = mx.repeat(obs.values[:, n_sink:].astype(mx.float32), group, axis=0)
        cosine = mx.clip((_unit(keys) * anchor[:, None]).sum(axis=-1), -1.0, 1.0)  # [H_q, T']
        logits = self.tau * cosine
        weights = mx.exp(logits - logits.max(axis=-1, keepdims=True))
        scaled = values * mx.sqrt(weights + self.weight_epsilon)[..., None]
        capacity = mx.eye(values.shape[-1]) + scaled.transpose(0, 2, 1) @ scaled  # [H_q, D, D]
        # vᵀA⁻¹v = ‖L⁻¹v‖² with A = LLᵀ (A is symmetric positive definite); linear algebra runs on the CPU stream.
        lower = mx.linalg.cholesky(capacity, stream=mx.cpu)
        solved = mx.linalg.solve_triangular(lower, values.transpose(0, 2, 1), upper=False, stream=mx.cpu)
        scores = (weights * (solved * solved).sum(axis=1)).reshape(n_kv, group, -1).mean(axis=1)
        sinks = mx.broadcast_to(scores.max() + 1, (n_kv, n_sink))
        return mx.concatenate([sinks, scores], axis=1)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return np.arange(min(self.n_sink, n_tokens))
