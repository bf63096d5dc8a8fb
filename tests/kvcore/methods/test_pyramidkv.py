"""pyramidkv: snapkv scores with the DESIGN.md per-layer counts, against brute force."""

import numpy as np

from kvcore import selection
from kvcore.methods import MethodParams
from tests.kvcore.methods.helpers import n_kept, observation, random_qk
from tests.kvcore.methods.test_snapkv import snapkv_oracle


def pyramid_counts(n_tokens, ratio, n_layers, window, beta=20):
    n = n_kept(n_tokens, ratio)
    c = window + n
    low = (c - window) / beta
    high = 2 * (c - window) - low
    step = (high - low) / (n_layers - 1)
    return [int(np.floor(high - layer * step + 0.5)) for layer in range(n_layers)]


def test_pyramidkv_matches_bruteforce_when_feasible():
    data = [random_qk(20 + layer, 160, 2, 2, 8) for layer in range(4)]
    ranking = selection.rank([observation(q, k) for q, k in data], "pyramidkv", MethodParams(window=4))
    counts = pyramid_counts(160, 0.5, 4, window=4)
    assert counts[0] > counts[-1] and abs(sum(counts) - 4 * 80) <= 2
    kept = selection.select(ranking, 0.5)
    for layer, (q, k) in enumerate(data):
        np.testing.assert_array_equal(kept[layer], snapkv_oracle(q, k, counts[layer], window=4))


def test_pyramidkv_falls_back_to_snapkv_when_infeasible():
    data = [random_qk(30 + layer, 100, 2, 2, 8) for layer in range(3)]
    ranking = selection.rank([observation(q, k) for q, k in data], "pyramidkv")
    kept = selection.select(ranking, 0.25)  # min = 25/20 < window 64: uniform
    for layer, (q, k) in enumerate(data):
        np.testing.assert_array_equal(kept[layer], snapkv_oracle(q, k, 25))
