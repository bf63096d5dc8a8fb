"""knorm against a brute-force NumPy reading of DESIGN.md, per head and in shared mode."""

import numpy as np
import pytest

from kvcore.methods import selection
from tests.kvcore.methods.helpers import RATIOS, SHAPES, keep, kvcore_kept, n_kept, observation, random_qk


@pytest.mark.parametrize("shape", SHAPES)
def test_knorm_matches_bruteforce(shape):
    q, k = random_qk(7, *shape)
    obs = observation(q, k)
    norms = np.sqrt((k.astype(np.float64) ** 2).sum(axis=-1))  # [H_kv, T]
    for ratio in RATIOS:
        n = n_kept(shape[0], ratio)
        expected = np.stack([keep(-norms[h], n, []) for h in range(k.shape[0])])
        np.testing.assert_array_equal(kvcore_kept(obs, "knorm", ratio), expected)


def test_knorm_shared_mode_uses_the_mean_over_heads():
    q, k = random_qk(8, 90, 4, 2, 16)
    mean_score = -np.sqrt((k.astype(np.float64) ** 2).sum(axis=-1)).mean(axis=0)
    ranking = selection.rank([observation(q, k)], "knorm")
    for ratio in (0.1, 0.5):
        kept = selection.select(ranking, ratio, per_head=False)[0]
        np.testing.assert_array_equal(kept, keep(mean_score, n_kept(90, ratio), []))
