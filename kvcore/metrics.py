"""Quality metrics of a compressed cache against the dense (B0) baseline, on NumPy arrays.

Teacher-forced metrics feed the dense greedy continuation to both caches, so every step compares the two
distributions on the same history; the free-running continuation gives the first divergence a user sees.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable log-softmax over the last axis, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def teacher_forced(dense_logits: np.ndarray, comp_logits: np.ndarray, targets: np.ndarray) -> dict:
    """Agreement, KL(dense ‖ compressed) per step (mean, max) and NLL delta on the dense continuation.

    dense_logits, comp_logits: [n, V] logits predicting targets[i] at step i; targets: [n] token ids.
    """
    if dense_logits.shape != comp_logits.shape or dense_logits.shape[0] != len(targets):
        raise ValueError(
            f"shapes differ: dense {dense_logits.shape}, compressed {comp_logits.shape}, targets {len(targets)}"
        )
    if len(targets) == 0:
        return {"agreement": float("nan"), "kl_mean": float("nan"), "kl_max": float("nan"), "nll_delta": 0.0}
    lp_d, lp_c = log_softmax(dense_logits), log_softmax(comp_logits)
    kl = np.maximum((np.exp(lp_d) * (lp_d - lp_c)).sum(axis=-1), 0.0)
    rows = np.arange(len(targets))
    nll_d = -lp_d[rows, targets]
    nll_c = -lp_c[rows, targets]
    return {
        "agreement": float((comp_logits.argmax(axis=-1) == np.asarray(targets)).mean()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "kl_per_step": kl.tolist(),
        "nll_dense": float(nll_d.mean()),
        "nll_compressed": float(nll_c.mean()),
        "nll_delta": float(nll_c.mean() - nll_d.mean()),
    }


def first_divergence(dense_tokens: Sequence[int], comp_tokens: Sequence[int]) -> int | None:
    """Index of the first generated token that differs, or None if the shorter run matches throughout."""
    for i, (a, b) in enumerate(zip(dense_tokens, comp_tokens, strict=False)):
        if a != b:
            return i
    return None


def attention_mass_kept(window_attention: np.ndarray, kept: Sequence[np.ndarray]) -> np.ndarray:
    """Per kv-head share of the window queries' attention that falls on kept positions.

    window_attention: [H_kv, T] mean attention of the window queries (rows sum to 1 over the prompt);
    kept: per kv-head arrays of kept prompt positions (positions ≥ T, i.e. generated tokens, are ignored).
    """
    T = window_attention.shape[1]
    out = np.empty(window_attention.shape[0], dtype=np.float64)
    for h, pos in enumerate(kept):
        pos = np.asarray(pos)
        out[h] = float(window_attention[h, pos[pos < T]].sum())
    return out


def rmse_per_head(original: np.ndarray, approx: np.ndarray) -> np.ndarray:
    """Root-mean-square error per head over [H, n, D] arrays (0 for a head with no rows)."""
    diff = np.asarray(original, dtype=np.float64) - np.asarray(approx, dtype=np.float64)
    if diff.shape[1] == 0:
        return np.zeros(diff.shape[0])
    return np.sqrt((diff**2).mean(axis=(1, 2)))
