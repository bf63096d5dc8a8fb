"""cap against a float64 NumPy reading of kvpress's CapPress on real llama / qwen3 layers."""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import methods
from kvcore.capture import prefill as capture
from kvcore.methods import selection
from tests.kvcore.methods import real_layers
from tests.kvcore.methods.helpers import keep, n_kept
from tests.kvcore.methods.test_expected_attention import inv_freqs, rope_matrix
from tests.model_factory import ARCHS


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def mean_rotation(config: dict, n: int) -> np.ndarray:
    """R̄: the mean RoPE matrix of positions n … n + 511."""
    return np.mean([rope_matrix(inv_freqs(config), p) for p in range(n, n + 512)], axis=0)


def oracle(layer: real_layers.Layer, r_bar: np.ndarray, n_sink: int, tau: float, eps: float) -> np.ndarray:
    """Scores [H_kv, T − n_sink] of the non-sink positions."""
    anchor = unit(layer.queries_pre[:, n_sink:].mean(axis=1) @ r_bar.T)  # [H_q, D]
    n_kv = layer.keys.shape[0]
    group = anchor.shape[0] // n_kv
    keys = np.repeat(layer.keys[:, n_sink:], group, axis=0)
    values = np.repeat(layer.values[:, n_sink:], group, axis=0)
    logits = tau * np.clip(np.einsum("htd,hd->ht", unit(keys), anchor), -1, 1)
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    capacity = np.eye(values.shape[-1]) + np.einsum("ht,htd,hte->hde", w + eps, values, values)
    leverage = np.einsum("htd,hde,hte->ht", values, np.linalg.inv(capacity), values)
    return (w * leverage).reshape(n_kv, group, -1).mean(axis=1)


@pytest.mark.parametrize(
    ("arch", "n_sink", "tau"), [("llama", 4, 5.0), ("qwen3", 0, 2.0), ("llama", 20, 5.0)]
)
def test_cap_matches_numpy(loaded_models, arch, n_sink, tau):
    model = loaded_models[arch][0]
    config = dict(ARCHS[arch])
    ids = real_layers.prompt_ids(model)
    result = capture.prefill_with_capture(model, ids, chunk_size=37)
    ranking = selection.rank(result.observations, methods.get("cap", n_sink=n_sink, tau=tau))
    r_bar = mean_rotation(config, len(ids))
    for i, layer in enumerate(real_layers.layers(model, config, ids)):
        want = oracle(layer, r_bar, n_sink, tau, 1e-6)
        got = ranking.layers[i].scores
        np.testing.assert_allclose(got[:, n_sink:], want, rtol=2e-4, atol=1e-6)
        assert (got[:, :n_sink] > got[:, n_sink:].max()).all()
        scores = np.concatenate([np.zeros((want.shape[0], n_sink)), want], axis=1)
        top = np.stack([keep(row, n_kept(len(ids), 0.3), list(range(n_sink))) for row in scores])
        np.testing.assert_array_equal(selection.select(ranking, 0.3)[i], top)


def test_prompt_no_longer_than_the_sinks_is_one_line(loaded_models):
    model = loaded_models["llama"][0]
    result = capture.prefill_with_capture(model, real_layers.prompt_ids(model, 4, 1))
    with pytest.raises(ValueError, match="longer than n_sink=4, got 4 tokens: lower n_sink"):
        selection.rank(result.observations, "cap")
