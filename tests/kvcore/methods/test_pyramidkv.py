"""pyramidkv: snapkv scores kept at the per-layer counts of `budgets.pyramidkv`, against brute force.

The counts themselves are checked in test_budgets.py (properties and hand-computed numbers); here the method
must keep, layer by layer, exactly what snapkv's brute force keeps at that layer's count.
"""

import numpy as np

from kvcore import methods
from kvcore.methods import budgets, selection
from tests.kvcore.methods.helpers import observation, random_qk
from tests.kvcore.methods.test_snapkv import snapkv_oracle


def test_pyramidkv_matches_bruteforce_when_feasible():
    data = [random_qk(20 + layer, 160, 2, 2, 8) for layer in range(4)]
    ranking = selection.rank([observation(q, k) for q, k in data], methods.get("pyramidkv", window=4))
    budget = budgets.pyramidkv(160, 0.5, 4, window=4)
    counts = budget.counts
    assert budget.fallback is None and counts[0] > counts[-1]  # a real pyramid, not the uniform fallback
    kept = selection.select(ranking, 0.5)
    for layer, (q, k) in enumerate(data):
        np.testing.assert_array_equal(kept[layer], snapkv_oracle(q, k, counts[layer], window=4))


def test_pyramidkv_falls_back_to_snapkv_when_infeasible():
    data = [random_qk(30 + layer, 100, 2, 2, 8) for layer in range(3)]
    ranking = selection.rank([observation(q, k) for q, k in data], "pyramidkv")
    kept = selection.select(ranking, 0.25)  # min = 25/20 < window 64: uniform
    for layer, (q, k) in enumerate(data):
        np.testing.assert_array_equal(kept[layer], snapkv_oracle(q, k, 25))


def test_pyramidkv_forms_the_published_pyramid_on_780_positions():
    """At r = 0.5 on 780 positions and 8 layers, kvpress keeps 716 ... 64: so must we, each layer snapkv's top."""
    data = [random_qk(40 + layer, 780, 2, 1, 8) for layer in range(8)]
    ranking = selection.rank([observation(q, k) for q, k in data], "pyramidkv")
    kept = selection.select(ranking, 0.5)
    assert [k.shape[1] for k in kept] == [716, 623, 530, 437, 343, 250, 157, 64]
    for layer, (q, k) in enumerate(data):
        np.testing.assert_array_equal(kept[layer], snapkv_oracle(q, k, kept[layer].shape[1]))
