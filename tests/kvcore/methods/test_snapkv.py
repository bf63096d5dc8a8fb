"""snapkv against a brute-force NumPy reading of DESIGN.md."""

import numpy as np
import pytest

from tests.kvcore.methods.helpers import (
    RATIOS,
    SHAPES,
    attention_row,
    keep,
    kvcore_kept,
    n_kept,
    observation,
    random_qk,
)


def snapkv_oracle_scores(q, k, window=64, kernel=5):
    """Last w queries attend causally; mean over them of the pre-window columns; avg-pool; GQA mean: [H_kv, T-w]."""
    n_q, n_tokens, head_dim = q.shape
    n_kv = k.shape[0]
    group, scale, w = n_q // n_kv, head_dim**-0.5, min(window, n_tokens)
    votes = np.zeros((n_q, n_tokens - w))
    for h in range(n_q):
        for pos in range(n_tokens - w, n_tokens):
            votes[h] += attention_row(q[h, pos], k[h // group], pos, scale)[: n_tokens - w] / w
    pooled = np.zeros_like(votes)
    for t in range(n_tokens - w):
        for j in range(t - kernel // 2, t + kernel // 2 + 1):
            if 0 <= j < n_tokens - w:
                pooled[:, t] += votes[:, j] / kernel
    return pooled.reshape(n_kv, group, -1).mean(axis=1)


def snapkv_oracle(q, k, n, window=64, kernel=5):
    """The top snapkv scores before the window, plus the window (always kept)."""
    n_kv, n_tokens = k.shape[:2]
    w = min(window, n_tokens)
    per_kv = snapkv_oracle_scores(q, k, window, kernel)
    window_first = list(range(n_tokens - 1, n_tokens - w - 1, -1))  # most recent first when n < w
    return np.stack([keep(np.concatenate([per_kv[h], np.zeros(w)]), n, window_first) for h in range(n_kv)])


@pytest.mark.parametrize("shape", SHAPES)
def test_snapkv_matches_bruteforce(shape):
    q, k = random_qk(1, *shape)
    obs = observation(q, k)
    for ratio in RATIOS:
        expected = snapkv_oracle(q, k, n_kept(shape[0], ratio))
        np.testing.assert_array_equal(kvcore_kept(obs, "snapkv", ratio), expected, err_msg=f"ratio {ratio}")


def test_snapkv_other_window_and_kernel():
    q, k = random_qk(2, 120, 2, 2, 16)
    obs = observation(q, k)
    for ratio in (0.2, 0.6):
        expected = snapkv_oracle(q, k, n_kept(120, ratio), window=16, kernel=3)
        np.testing.assert_array_equal(kvcore_kept(obs, "snapkv", ratio, window=16, kernel=3), expected)


def test_window_wider_than_captured_is_refused():
    q, k = random_qk(3, 100, 1, 2, 8)
    with pytest.raises(ValueError, match="capture with window >= 80"):
        kvcore_kept(observation(q, k, window=64), "snapkv", 0.5, window=80)
