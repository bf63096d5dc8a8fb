"""tova against a brute-force NumPy reading of DESIGN.md."""

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


def tova_oracle(q, k, n):
    """The last query's attention averaged over ALL query heads; the last position always kept; one set."""
    n_q, n_tokens, head_dim = q.shape
    group = n_q // k.shape[0]
    last = np.mean(
        [attention_row(q[h, -1], k[h // group], n_tokens - 1, head_dim**-0.5) for h in range(n_q)], 0
    )
    return keep(last, n, [n_tokens - 1])


@pytest.mark.parametrize("shape", SHAPES)
def test_tova_matches_bruteforce(shape):
    q, k = random_qk(6, *shape)
    obs = observation(q, k)
    for ratio in RATIOS:
        kept = kvcore_kept(obs, "tova", ratio)
        assert kept.ndim == 1, "tova keeps the same positions in every kv-head"
        np.testing.assert_array_equal(
            kept, tova_oracle(q, k, n_kept(shape[0], ratio)), err_msg=f"ratio {ratio}"
        )
