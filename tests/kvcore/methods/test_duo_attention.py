"""duo_attention against a float64 NumPy reading of kvpress's on-the-fly DuoAttention scoring, on real layers.

The oracle's pre-RoPE queries and keys come from the weights (real_layers), its RoPE from explicit rotation
matrices; head scores, the model-wide choice of streaming heads and their kept positions are checked.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import methods
from kvcore.capture import prefill as capture
from kvcore.methods import selection
from tests.kvcore.methods import real_layers
from tests.kvcore.methods.test_expected_attention import inv_freqs, rope_matrix
from tests.model_factory import ARCHS


def oracle_head_scores(layer: real_layers.Layer, inv: np.ndarray, n_positions: int) -> np.ndarray:
    """[H_kv]: mean of the cumulative attention of the last repeated mean query over the repeated mean keys."""
    n_q, n_kv = layer.queries_pre.shape[0], layer.keys_pre.shape[0]
    d = layer.keys_pre.shape[-1]
    rotations = np.stack([rope_matrix(inv, p) for p in range(n_positions)])  # [P, D, D]
    keys = np.einsum("pij,hj->hpi", rotations, layer.keys_pre.mean(axis=1))  # [H_kv, P, D]
    query = layer.queries_pre.mean(axis=1) @ rotations[-1].T  # [H_q, D]
    keys = np.repeat(keys, n_q // n_kv, axis=0)
    logits = np.einsum("hd,hpd->hp", query, keys) / np.sqrt(d)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return np.cumsum(weights, axis=1).mean(axis=1).reshape(n_kv, -1).mean(axis=1)


@pytest.mark.parametrize("ratio", [0.3, 0.75])
def test_duo_attention_matches_numpy(loaded_models, ratio):
    model = loaded_models["llama"][0]
    config = dict(ARCHS["llama"])
    ids = real_layers.prompt_ids(model)
    sink, recent, n_positions = 4, 16, 50
    result = capture.prefill_with_capture(model, ids, chunk_size=37)
    method = methods.get("duo_attention", sink_size=sink, recent_size=recent, n_query_positions=n_positions)
    ranking = selection.rank(result.observations, method)
    layers = real_layers.layers(model, config, ids)
    want = np.stack([oracle_head_scores(layer, inv_freqs(config), n_positions) for layer in layers])
    got = np.stack([r.scores.min(axis=1) for r in ranking.layers])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    n_streaming = round(want.size * (1 - ratio))
    streaming = np.zeros(want.size, bool)
    streaming[np.argsort(want, axis=None)[:n_streaming]] = True
    streaming = streaming.reshape(want.shape)
    n = len(ids)
    short = np.r_[0:sink, n - recent : n]
    kept = selection.select(ranking, ratio)
    for i, heads in enumerate(kept):
        for h, positions in enumerate(heads):
            np.testing.assert_array_equal(positions, short if streaming[i, h] else np.arange(n))


def test_duo_attention_refuses_shared_selection(loaded_models):
    model = loaded_models["llama"][0]
    result = capture.prefill_with_capture(model, real_layers.prompt_ids(model, n=20))
    ranking = selection.rank(result.observations, methods.get("duo_attention"))
    with pytest.raises(ValueError, match="per kv-head"):
        selection.select(ranking, 0.5, per_head=False)
