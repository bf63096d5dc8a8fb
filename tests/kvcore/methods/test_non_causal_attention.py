"""non_causal_attention against a float64 NumPy reading of kvpress's NonCausalAttnPress on real llama layers."""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import methods
from kvcore.capture import prefill as capture
from kvcore.methods import selection
from tests.kvcore.methods import real_layers
from tests.kvcore.methods.helpers import keep, n_kept
from tests.model_factory import ARCHS


def column_sums(q: np.ndarray, k: np.ndarray, c: int) -> np.ndarray:
    """Per chunk of c positions, non-causal softmax rows (no scale) summed over queries; the last chunk padded
    with zero queries and keys whose logits are −1e-9, as kvpress pads it."""
    n_heads, n, d = q.shape
    out = np.zeros((n_heads, n))
    for start in range(0, n, c):
        qc, kc = q[:, start : start + c], k[:, start : start + c]
        m = qc.shape[1]
        logits = np.full((n_heads, c, c), -1e-9)
        logits[:, :, :m] = 0.0
        logits[:, :m, :m] = qc @ kc.transpose(0, 2, 1)
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        out[:, start : start + m] = p.sum(axis=1)[:, :m]
    return out


def oracle(layer: real_layers.Layer, c: int) -> np.ndarray:
    n_kv = layer.keys.shape[0]
    group = layer.queries.shape[0] // n_kv
    sums = column_sums(layer.queries, np.repeat(layer.keys, group, axis=0), c)
    s = sums.reshape(n_kv, group, -1).mean(axis=1) * np.linalg.norm(layer.values, axis=-1)
    padded = np.pad(s, [(0, 0), (1, 1)])
    return real_layers.z_scored((padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]) / 3)


@pytest.mark.parametrize("chunk_size", [256, 32, 25])
def test_non_causal_attention_matches_numpy(loaded_models, chunk_size):
    model = loaded_models["llama"][0]
    ids = real_layers.prompt_ids(model)
    result = capture.prefill_with_capture(model, ids, chunk_size=37, h2o="lazy")
    ranking = selection.rank(result.observations, methods.get("non_causal_attention", chunk_size=chunk_size))
    for i, layer in enumerate(real_layers.layers(model, dict(ARCHS["llama"]), ids)):
        want = oracle(layer, chunk_size)
        np.testing.assert_allclose(ranking.layers[i].scores, want, rtol=1e-4, atol=1e-4)
        top = np.stack([keep(row, n_kept(len(ids), 0.3), []) for row in want])
        np.testing.assert_array_equal(selection.select(ranking, 0.3)[i], top)


def test_queries_gone_after_h2o_is_one_line(loaded_models, monkeypatch):
    from kvcore import defaults

    monkeypatch.setattr(defaults, "KEEP_PROMPT_QUERIES_BYTES", 0)  # a long prompt: h2o frees its queries
    model = loaded_models["llama"][0]
    result = capture.prefill_with_capture(model, real_layers.prompt_ids(model, 20, 1), h2o="lazy")
    selection.rank(result.observations, "h2o")  # computes h2o's sums and frees the queries
    with pytest.raises(ValueError, match="needs every prompt query") as error:
        selection.rank(result.observations, "non_causal_attention")
    assert "\n" not in str(error.value)
