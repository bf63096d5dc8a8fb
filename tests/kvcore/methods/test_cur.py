"""cur against a float64 NumPy reading of kvpress's CURPress on a real llama's cached keys and values."""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import methods
from kvcore.capture import prefill as capture
from kvcore.methods import selection
from tests.kvcore.methods import real_layers
from tests.kvcore.methods.helpers import keep, n_kept
from tests.model_factory import ARCHS


def local(x: np.ndarray, w: int) -> np.ndarray:
    """Each value over the sum of its window of w positions (the last window shorter)."""
    out = np.empty_like(x)
    for start in range(0, x.shape[1], w):
        block = x[:, start : start + w]
        out[:, start : start + w] = block / block.sum(axis=1, keepdims=True)
    return out


def oracle(k, v, layer, leverage_type, random, use_local, w, seed, n_sink):
    if random:
        g = np.random.default_rng([seed, layer]).standard_normal((k.shape[-1], 20)).astype(
            np.float32
        ) / np.sqrt(20)
        k, v = k @ g, v @ g
    k2, v2 = (k * k).sum(-1), (v * v).sum(-1)
    if use_local:
        k2, v2 = local(k2, w), local(v2, w)
    s = (k2, v2, (k2 + v2) / 2, k2 * v2)[leverage_type]
    s = s / s.sum(axis=1, keepdims=True)
    s[:, :n_sink] = 1.0
    return s


@pytest.mark.parametrize(
    ("leverage_type", "random", "use_local", "w", "n_sink"),
    [(3, 0, 1, 16, 4), (0, 0, 1, 7, 0), (1, 1, 0, 16, 2), (2, 1, 1, 16, 4)],
)
def test_cur_matches_numpy(loaded_models, leverage_type, random, use_local, w, n_sink):
    model = loaded_models["llama"][0]
    ids = real_layers.prompt_ids(model)
    result = capture.prefill_with_capture(model, ids, chunk_size=37)
    params = dict(leverage_type=leverage_type, use_random_leverage=random, use_local_approximation=use_local)
    method = methods.get("cur", local_window_size=w, num_sinks=n_sink, sketch_seed=1, **params)
    ranking = selection.rank(result.observations, method)
    for i, layer in enumerate(real_layers.layers(model, dict(ARCHS["llama"]), ids)):
        want = oracle(layer.keys, layer.values, i, leverage_type, random, use_local, w, 1, n_sink)
        np.testing.assert_allclose(ranking.layers[i].scores, want, rtol=1e-4, atol=1e-7)
        top = np.stack([keep(row, n_kept(len(ids), 0.3), list(range(n_sink))) for row in want])
        np.testing.assert_array_equal(selection.select(ranking, 0.3)[i], top)
