"""Shared statistics of the sketching schemes' tests: inner-product errors over correlated unit pairs, each batch
under a fresh seed (the schemes' rotation and sketch), so the mean and variance are over the random matrices too."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvcore.quant import get

N_SEEDS, PER_SEED, DIM = 50, 200, 128  # 10⁴ pairs
RHO = 0.6  # <x, y> of a pair: a score worth estimating, where a biased estimator shows its bias


def unit_rows(rng: np.random.Generator, n: int, d: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def pairs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """PER_SEED unit x and unit y with <x, y> ≈ RHO."""
    rng = np.random.default_rng(1000 + seed)
    x = unit_rows(rng, PER_SEED)
    y = RHO * x + np.sqrt(1 - RHO**2) * unit_rows(rng, PER_SEED)
    return x, y / np.linalg.norm(y, axis=1, keepdims=True)


def errors(name: str, bits: int) -> tuple[np.ndarray, list[tuple[mx.array, ...]]]:
    """<y, x̂> − <y, x> [N_SEEDS, PER_SEED] and each batch's stored parts."""
    out, parts = [], []
    for seed in range(N_SEEDS):
        x, y = pairs(seed)
        scheme = get(name, seed=seed)
        stored = scheme.pack(mx.array(x.astype(np.float32)), bits)
        x_hat = np.array(scheme.unpack(stored, bits), dtype=np.float64)
        out.append(np.sum(y * x_hat, axis=1) - np.sum(y * x, axis=1))
        parts.append(stored)
    return np.array(out), parts


def mean_and_error(per_pair: np.ndarray) -> tuple[float, float]:
    """Mean over every pair, and its standard error from the N_SEEDS batch means (pairs share a seed's matrices)."""
    means = per_pair.mean(axis=1)
    return float(means.mean()), float(means.std(ddof=1) / np.sqrt(len(means)))
