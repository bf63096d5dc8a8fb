"""snapkv (Li et al. 2024): the last `window` prompt queries vote for the earlier keys they attend to."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import param
from kvcore.defaults import DEFAULT_KERNEL
from kvcore.methods.base import Method, effective_window, group_mean, window_attention, window_param


def avg_pool(x: mx.array, kernel: int) -> mx.array:
    """1-D average pooling along the last axis: stride 1, zero padding kernel // 2, padding counted."""
    pad = kernel // 2
    padded = mx.pad(x, [(0, 0), (pad, pad)])
    n = x.shape[-1]
    return sum(padded[:, i : i + n] for i in range(kernel)) / kernel


def snapkv_scores(obs: LayerObservation, window: int, kernel: int) -> mx.array:
    """Window-attention votes for the columns before the window, pooled, GQA-averaged; window columns score 1."""
    w = effective_window(obs, window)
    n_before = obs.n_tokens - w
    votes = window_attention(obs, w)[:, :, :n_before].mean(axis=1)  # [H_q, T - w]
    pooled = group_mean(avg_pool(votes, kernel), obs.n_kv_heads)
    # Softmax means are <= 1, so 1 marks the always-kept window as top-scoring in a heatmap too.
    return mx.concatenate([pooled, mx.ones((obs.n_kv_heads, w), mx.float32)], axis=1)


@dataclass(frozen=True)
class SnapKV(Method):
    name = "snapkv"
    description = "The last prompt queries vote for the keys they attend to (pooled); the window is kept"
    paper = "SnapKV: LLM Knows What You are Looking for Before Generation (Li et al. 2024), arXiv:2404.14469"

    window: int = window_param()
    kernel: int = param(DEFAULT_KERNEL, "average-pooling kernel over the votes (odd)", minimum=1, odd=True)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        return snapkv_scores(obs, self.window, self.kernel)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        """The window, most recent first (when the budget is below the window, the latest queries win)."""
        return np.arange(n_tokens - 1, n_tokens - 1 - min(self.window, n_tokens), -1)
