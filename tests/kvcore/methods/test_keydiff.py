"""keydiff against a NumPy reading of its definition: minus the cosine to the mean normalised key, per kv-head."""

import numpy as np
import pytest

from kvcore.methods import selection
from tests.kvcore.methods.helpers import RATIOS, SHAPES, keep, kvcore_kept, n_kept, observation, random_qk


def keydiff_scores(k: np.ndarray) -> np.ndarray:
    k = k.astype(np.float64)
    unit = k / np.linalg.norm(k, axis=-1, keepdims=True)
    anchor = unit.mean(axis=1, keepdims=True)
    return -(k * anchor).sum(-1) / (np.linalg.norm(k, axis=-1) * np.linalg.norm(anchor, axis=-1))


@pytest.mark.parametrize("shape", SHAPES)
def test_keydiff_matches_numpy(shape):
    q, k = random_qk(11, *shape)
    obs = observation(q, k)
    want = keydiff_scores(k)
    np.testing.assert_allclose(selection.rank([obs], "keydiff").layers[0].scores, want, rtol=1e-4, atol=1e-6)
    for ratio in RATIOS:
        n = n_kept(shape[0], ratio)
        expected = np.stack([keep(want[h], n, []) for h in range(k.shape[0])])
        np.testing.assert_array_equal(kvcore_kept(obs, "keydiff", ratio), expected)


def test_keydiff_keeps_the_outlier_key():
    _, k = random_qk(12, 60, 1, 1, 16)
    k[0] = np.abs(k[0]) + 1.0  # every key leans the same way ...
    k[0, 17] = -k[0, 17]  # ... but one
    q = np.zeros((1, 60, 16), np.float32)
    assert 17 in kvcore_kept(observation(q, k), "keydiff", 0.05)[0]
