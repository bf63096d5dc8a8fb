"""leverage against a float64 NumPy reading of kvpress's LeverageScorePress on real llama / qwen3 layers.

The oracle's pre-RoPE keys come from the weights (real_layers), kvcore's from un-rotating the cached keys; the
sketch is the documented one (NumPy's generator seeded by (sketch_seed, layer)), drawn here independently.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import methods
from kvcore.capture import prefill as capture
from kvcore.methods import selection
from tests.kvcore.methods import real_layers
from tests.kvcore.methods.helpers import keep, n_kept
from tests.model_factory import ARCHS


def oracle(keys_pre: np.ndarray, layer: int, width: int, seed: int) -> np.ndarray:
    """Raw leverage [H_kv, T]: diag(X (XᵀX + 0.01 I)⁻¹ Xᵀ), X = centred keys times the sketch."""
    n_kv, _, d = keys_pre.shape
    phi = np.random.default_rng([seed, layer]).standard_normal((n_kv, d, width)).astype(np.float32) / np.sqrt(
        width
    )
    x = (keys_pre - keys_pre.mean(axis=1, keepdims=True)) @ phi.astype(np.float64)
    gram = np.einsum("htk,htl->hkl", x, x) + 1e-2 * np.eye(width)
    return np.maximum(np.einsum("htk,hkl,htl->ht", x, np.linalg.inv(gram), x), 0)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize(("width", "seed"), [(48, 0), (16, 3)])
def test_leverage_matches_numpy(loaded_models, arch, width, seed):
    model = loaded_models[arch][0]
    ids = real_layers.prompt_ids(model)
    result = capture.prefill_with_capture(model, ids, chunk_size=37)
    method = methods.get("leverage", sketch_dimension=width, sketch_seed=seed)
    ranking = selection.rank(result.observations, method)
    for i, layer in enumerate(real_layers.layers(model, dict(ARCHS[arch]), ids)):
        want = real_layers.z_scored(oracle(layer.keys_pre, i, width, seed))
        np.testing.assert_allclose(ranking.layers[i].scores, want, rtol=1e-4, atol=1e-4)
        top = np.stack([keep(row, n_kept(len(ids), 0.3), []) for row in want])
        kept = selection.select(ranking, 0.3)[i]
        np.testing.assert_array_equal(kept, top)
