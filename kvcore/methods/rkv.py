"""rkv (Cai et al. 2025, "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models"): importance minus
redundancy, for the long, self-repeating traces reasoning models write.

Per kv-head over the T rows a layer holds, the last `window` rows being the observation window (always kept):
- importance I: the attention of the window's queries over the earlier rows (causal softmax, mean over the window
  and the GQA group), max-pooled along the rows (kernel `kernel`, stride 1, padding kernel // 2);
- redundancy R: S = cosine similarities of every pair of keys (ε = 1e-8 in the norms), the diagonal zeroed; in each
  row i the last column j with S_ij > `redundancy_threshold` (column 0 when none) is zeroed too — the latest similar key is
  not counted against i (the authors' "last" retain direction); R = softmax over the rows of the row means of S;
- score = λ·I − (1 − λ)·R for the rows before the window; window rows score the layer's maximum.

Defaults are the authors' released ones (kvcore.defaults RKV_*). R-KV is a decoding-time method: as a decoding
policy (kvcore.engine.decoding) the window's queries are the tokens fed since the last check. At prefill it scores
the prompt the same way from its last queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import param
from kvcore.defaults import CAPTURE_WINDOW, RKV_KERNEL, RKV_LAMBDA, RKV_SIMILARITY_THRESHOLD, RKV_WINDOW
from kvcore.methods.base import Method, effective_window, group_mean, window_attention

_NORM_EPSILON = 1e-8


def max_pool(x: mx.array, kernel: int) -> mx.array:
    """1-D max pooling along the last axis: stride 1, padding kernel // 2 that never wins (−inf)."""
    pad = kernel // 2
    padded = mx.pad(x, [(0, 0), (pad, pad)], constant_values=-mx.inf)
    n = x.shape[-1]
    out = padded[:, :n]
    for i in range(1, kernel):
        out = mx.maximum(out, padded[:, i : i + n])
    return out


def redundancy(keys: mx.array, threshold: float) -> mx.array:
    """R [H_kv, T]: softmax over the rows of each key's mean cosine similarity to the others (module docstring).
    One kv-head at a time, each evaluated before the next: a head's similarities are T² floats (256 MiB at 8k
    tokens), where all heads at once peaked at 4.8 GB for one layer of 8 kv-heads at 8k."""
    rows = []
    for head in keys.astype(mx.float32):
        rows.append(_head_redundancy(head, threshold))
        mx.eval(rows[-1])
    return mx.stack(rows)


def _head_redundancy(k: mx.array, threshold: float) -> mx.array:
    """[T] of one head's keys [T, D]."""
    unit = k / (mx.sqrt((k * k).sum(axis=-1, keepdims=True)) + _NORM_EPSILON)
    sim = unit @ unit.T  # [T, T]
    n = sim.shape[-1]
    columns = mx.arange(n)
    sim = mx.where(columns[:, None] == columns[None, :], 0.0, sim)
    last = mx.where(sim > threshold, columns[None, :], 0).max(axis=-1)  # [T]
    sim = mx.where(columns[None, :] == last[:, None], 0.0, sim)
    return mx.softmax(sim.mean(axis=-1), axis=-1, precise=True)


def rkv_scores(
    obs: LayerObservation, window: int, kernel: int, mix_lambda: float, threshold: float
) -> mx.array:
    """Scores [H_kv, T] float32 (module docstring)."""
    if obs.latent:
        raise ValueError("rkv does not score multi-head latent attention (MLA) layers: choose another method")
    w = effective_window(obs, window)
    n_before = obs.n_tokens - w
    if n_before == 0:
        return mx.ones((obs.n_kv_heads, obs.n_tokens), mx.float32)
    votes = window_attention(obs, w)[:, :, :n_before].mean(axis=1)  # [H_q, T − w]
    importance = max_pool(group_mean(votes, obs.n_kv_heads), kernel)
    redundant = redundancy(obs.keys, threshold)[:, :n_before]
    scores = mix_lambda * importance - (1 - mix_lambda) * redundant
    top = mx.broadcast_to(scores.max(), (obs.n_kv_heads, w))
    return mx.concatenate([scores, top], axis=1)


@dataclass(frozen=True)
class RKV(Method):
    name = "rkv"
    description = (
        "Window attention (max-pooled) minus key redundancy (cosine similarity), for reasoning traces"
    )
    paper = (
        "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models (Cai et al. 2025), arXiv:2505.24133"
    )

    window: int = param(
        RKV_WINDOW, "observation window: the latest queries, always kept", minimum=1, maximum=CAPTURE_WINDOW
    )
    kernel: int = param(
        RKV_KERNEL, "max-pooling kernel over the window's attention (odd)", minimum=1, odd=True
    )
    mix_lambda: float = param(
        RKV_LAMBDA, "λ: weight of importance against (1 − λ) redundancy", minimum=0.0, maximum=1.0
    )
    redundancy_threshold: float = param(
        RKV_SIMILARITY_THRESHOLD,
        "cosine similarity above which two keys are redundant",
        minimum=-1.0,
        maximum=1.0,
    )

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        return rkv_scores(obs, self.window, self.kernel, self.mix_lambda, self.redundancy_threshold)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        """The window, most recent first."""
        return np.arange(n_tokens - 1, n_tokens - 1 - min(self.window, n_tokens), -1)
