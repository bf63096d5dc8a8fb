"""Shared test inputs and NumPy building blocks for the brute-force oracles (no kvcore logic in here)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvcore.capture import prefill as capture
from kvcore.capture.prefill import LayerObservation

# (T, H_kv, group, head_dim): T below, at and above the default window of 64; GQA ratios 1, 2, 4.
SHAPES = [(10, 2, 1, 16), (64, 2, 2, 8), (100, 2, 2, 16), (150, 1, 4, 32), (203, 4, 1, 8)]
RATIOS = [0.05, 0.3, 0.5, 0.9, 1.0]


def random_qk(seed: int, n_tokens: int, n_kv_heads: int, group: int, head_dim: int):
    """All prompt queries [H_q, T, D] and keys [H_kv, T, D], scaled so attention is peaked, not flat."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(n_kv_heads * group, n_tokens, head_dim)).astype(np.float32) * 2
    k = rng.normal(size=(n_kv_heads, n_tokens, head_dim)).astype(np.float32)
    return q, k


def observation(q: np.ndarray, k: np.ndarray, window: int = 64, chunk: int = 37) -> LayerObservation:
    """What capture records for these queries/keys; h2o sums go through capture's chunked accumulator."""
    scale = q.shape[-1] ** -0.5
    sums = None
    for start in range(0, q.shape[1], chunk):
        stop = min(start + chunk, q.shape[1])
        sums = capture._accumulate_h2o(sums, mx.array(q[:, start:stop]), mx.array(k[:, :stop]), scale)
    return LayerObservation(
        keys=mx.array(k),
        window_queries=mx.array(q[:, -window:]),
        h2o_sums=sums,
        n_q_heads=q.shape[0],
        n_kv_heads=k.shape[0],
        scale=scale,
    )


def n_kept(n_tokens: int, ratio: float) -> int:
    """DESIGN.md: kvpress's n = int(T·(1 − c)) with c = 1 − r, at least 1."""
    return max(1, int(n_tokens * (1 - (1 - ratio))))


def attention_row(q_vec: np.ndarray, k: np.ndarray, pos: int, scale: float) -> np.ndarray:
    """Softmax attention of the query at `pos` over keys 0..pos (float64), zeros after it."""
    logits = (k[: pos + 1].astype(np.float64) @ q_vec.astype(np.float64)) * scale
    p = np.exp(logits - logits.max())
    row = np.zeros(k.shape[0])
    row[: pos + 1] = p / p.sum()
    return row


def keep(scores: np.ndarray, n: int, always: list[int]) -> np.ndarray:
    """Positions kept for one head: the always-kept (in priority order) first, then the top scores."""
    chosen, excluded = list(always[:n]), set(always)
    rest = [t for t in np.argsort(-scores, kind="stable") if t not in excluded]
    return np.array(sorted(chosen + rest[: n - len(chosen)]))


def kvcore_kept(obs: LayerObservation, method: str, ratio: float, **params):
    """kvcore's selection for a single layer."""
    from kvcore import methods
    from kvcore.methods import selection

    return selection.select(selection.rank([obs], methods.get(method, **params)), ratio)[0]
