"""random: uniform draws from default_rng([seed, layer]), reproducible, different per seed and per layer."""

import numpy as np

from kvcore import methods
from kvcore.methods import selection
from tests.kvcore.methods.helpers import keep, n_kept, observation, random_qk


def test_random_matches_the_seeded_generator():
    q, k = random_qk(9, 77, 2, 2, 8)
    obs = observation(q, k)
    ranking = selection.rank([obs, obs], methods.get("random", seed=3))
    for ratio in (0.1, 0.5, 1.0):
        kept = selection.select(ranking, ratio)
        for layer in (0, 1):
            draws = np.random.default_rng([3, layer]).random((2, 77))
            expected = np.stack([keep(draws[h], n_kept(77, ratio), []) for h in range(2)])
            np.testing.assert_array_equal(kept[layer], expected)


def test_random_depends_on_the_seed():
    q, k = random_qk(10, 200, 1, 1, 8)
    obs = observation(q, k)
    a = selection.select(selection.rank([obs], methods.get("random", seed=1)), 0.5)[0]
    b = selection.select(selection.rank([obs], methods.get("random", seed=2)), 0.5)[0]
    assert not np.array_equal(a, b)
