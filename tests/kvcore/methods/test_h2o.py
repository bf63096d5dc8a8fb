"""h2o against a brute-force NumPy reading of DESIGN.md (h2o sums come from capture's chunked accumulator)."""

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


def h2o_oracle(q, k, n):
    """Full causal attention over all prompt queries; column sums / (T - t); GQA mean; top n per kv-head."""
    n_q, n_tokens, head_dim = q.shape
    n_kv = k.shape[0]
    group = n_q // n_kv
    sums = np.zeros((n_q, n_tokens))
    for h in range(n_q):
        for pos in range(n_tokens):
            sums[h] += attention_row(q[h, pos], k[h // group], pos, head_dim**-0.5)
    normalised = sums / (n_tokens - np.arange(n_tokens))
    per_kv = normalised.reshape(n_kv, group, n_tokens).mean(axis=1)
    return np.stack([keep(per_kv[h], n, []) for h in range(n_kv)])


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chunk", [7, 1000])
def test_h2o_matches_bruteforce(shape, chunk):
    q, k = random_qk(4, *shape)
    obs = observation(q, k, chunk=chunk)
    for ratio in RATIOS:
        expected = h2o_oracle(q, k, n_kept(shape[0], ratio))
        np.testing.assert_array_equal(kvcore_kept(obs, "h2o", ratio), expected, err_msg=f"ratio {ratio}")


def test_h2o_without_sums_is_refused():
    q, k = random_qk(5, 20, 1, 1, 8)
    obs = observation(q, k)
    obs.h2o_sums = None
    with pytest.raises(ValueError, match="h2o=True"):
        kvcore_kept(obs, "h2o", 0.5)
