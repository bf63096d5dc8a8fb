"""rkv's redundancy holds one kv-head's T x T similarities at a time (at 8k tokens all heads at once peaked at
4.8 GB for one layer and took the benchmark's process down), with the same values as all heads at once."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvcore.methods.rkv import redundancy


def all_heads_at_once(keys: mx.array, threshold: float) -> np.ndarray:
    k = np.array(keys, np.float64)
    unit = k / (np.linalg.norm(k, axis=-1, keepdims=True) + 1e-8)
    sim = unit @ unit.transpose(0, 2, 1)
    n = sim.shape[-1]
    sim[:, np.arange(n), np.arange(n)] = 0.0
    last = np.where(sim > threshold, np.arange(n)[None, None, :], 0).max(axis=-1)
    np.put_along_axis(sim, last[..., None], 0.0, axis=-1)
    means = sim.mean(axis=-1)
    e = np.exp(means - means.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_redundancy_peaks_at_a_few_heads_squares_with_the_same_values():
    keys = mx.random.normal((8, 1024, 16), key=mx.random.key(3))
    mx.eval(keys)
    mx.clear_cache()
    mx.reset_peak_memory()
    start = mx.get_active_memory()
    got = redundancy(keys, 0.1)
    mx.eval(got)
    one_head = 1024 * 1024 * 4
    assert mx.get_peak_memory() - start < 6 * one_head  # all 8 heads at once: ~29 of them
    np.testing.assert_allclose(np.array(got), all_heads_at_once(keys, 0.1), rtol=1e-4, atol=1e-9)
