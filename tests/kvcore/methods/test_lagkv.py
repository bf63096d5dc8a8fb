"""lagkv against a NumPy reading of its definition (kvpress's LagKVPress): partitions scored by their successor."""

import mlx.core as mx
import numpy as np
import pytest

from kvcore import methods
from kvcore.methods import selection
from tests.kvcore.methods.helpers import keep, kvcore_kept, n_kept, observation, random_qk


def _with_values(q: np.ndarray, k: np.ndarray, v: np.ndarray):
    obs = observation(q, k)
    obs.values = mx.array(v)
    return obs


def lagkv_scores(k: np.ndarray, v: np.ndarray, n_sink: int, lag: int, cross: bool) -> np.ndarray:
    n_heads, n_tokens, _ = k.shape
    if n_tokens < n_sink + 2 * lag:
        out = np.ones((n_heads, n_tokens))
        out[:, n_sink:] = np.arange(n_tokens - n_sink) / (n_tokens - n_sink)
        return out
    end = n_sink + (n_tokens - n_sink) // lag * lag
    total = np.zeros((n_heads, end - n_sink - lag))
    for x in (k.astype(np.float64), v.astype(np.float64)):
        for h in range(n_heads):
            for p in range((end - n_sink) // lag - 1):
                rows = x[h, n_sink + p * lag : n_sink + (p + 1) * lag]
                ref = x[h, n_sink + (p + 1) * lag : n_sink + (p + 2) * lag]
                spread = ((rows - ref.min(0)) / (ref.max(0) - ref.min(0))).std(axis=-1, ddof=1)
                soft = np.exp(spread - spread.max())
                total[h, p * lag : (p + 1) * lag] += soft / soft.sum() / 2
    if not cross:
        parts = total.reshape(n_heads, -1, lag)
        total = (parts.argsort(-1).argsort(-1) / lag).reshape(n_heads, -1)
    tail = n_tokens - end + lag
    return np.concatenate([np.ones((n_heads, n_sink)), total, np.ones((n_heads, tail))], axis=1)


@pytest.mark.parametrize(("n_tokens", "lag", "cross"), [(203, 32, 0), (150, 16, 1), (97, 8, 0), (40, 32, 0)])
def test_lagkv_matches_numpy(n_tokens, lag, cross):
    q, k = random_qk(13, n_tokens, 2, 2, 16)
    v = np.random.default_rng(14).normal(size=k.shape).astype(np.float32)
    obs = _with_values(q, k, v)
    want = lagkv_scores(k, v, 4, lag, bool(cross))
    method = methods.get("lagkv", lag_size=lag, cross_scoring=cross)
    np.testing.assert_allclose(selection.rank([obs], method).layers[0].scores, want, rtol=1e-4, atol=1e-6)
    for ratio in (0.1, 0.3, 0.6):
        n = n_kept(n_tokens, ratio)
        expected = np.stack([keep(want[h], n, []) for h in range(2)])
        np.testing.assert_array_equal(
            kvcore_kept(obs, "lagkv", ratio, lag_size=lag, cross_scoring=cross), expected
        )


def test_lagkv_refuses_a_layer_without_values():
    q, k = random_qk(15, 300, 1, 1, 8)
    with pytest.raises(ValueError, match="lagkv scores keys and values"):
        selection.rank([observation(q, k)], "lagkv")
