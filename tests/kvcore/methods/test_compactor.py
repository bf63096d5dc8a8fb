"""compactor against a float64 NumPy reading of kvpress's CompactorPress on real llama layers: the leverage and
non-causal attention oracles on the positions between the sinks, blended."""

from __future__ import annotations

import numpy as np
import pytest

from kvcore import methods
from kvcore.capture import prefill as capture
from kvcore.methods import selection
from tests.kvcore.methods import real_layers
from tests.kvcore.methods.helpers import keep, n_kept
from tests.kvcore.methods.test_leverage import oracle as leverage
from tests.kvcore.methods.test_non_causal_attention import oracle as non_causal
from tests.model_factory import ARCHS


def oracle(
    layer: real_layers.Layer, index: int, start: int, end: int, chunk: int, blending: float
) -> np.ndarray:
    n = layer.keys.shape[1]
    left = min(start, n)
    right = min(end, max(0, n - left))
    stop = n - right
    middle = real_layers.Layer(*(a[:, left:stop] for a in vars(layer).values()))
    scores = blending * real_layers.z_scored(leverage(middle.keys_pre, index, 48, 0)) + non_causal(
        middle, chunk
    )
    return np.pad(scores, [(0, 0), (left, right)], constant_values=scores.max())


@pytest.mark.parametrize(("start", "end", "chunk", "blending"), [(8, 4, 256, 0.75), (3, 0, 20, 0.2)])
def test_compactor_matches_numpy(loaded_models, start, end, chunk, blending):
    model = loaded_models["llama"][0]
    ids = real_layers.prompt_ids(model)
    result = capture.prefill_with_capture(model, ids, chunk_size=37, h2o="lazy")
    params = dict(sink_size_start=start, sink_size_end=end, chunk_size=chunk, blending=blending)
    ranking = selection.rank(result.observations, methods.get("compactor", **params))
    always = [*range(start), *range(len(ids) - end, len(ids))]
    for i, layer in enumerate(real_layers.layers(model, dict(ARCHS["llama"]), ids)):
        want = oracle(layer, i, start, end, chunk, blending)
        np.testing.assert_allclose(ranking.layers[i].scores, want, rtol=1e-4, atol=2e-4)
        top = np.stack([keep(row, n_kept(len(ids), 0.3), always) for row in want])
        np.testing.assert_array_equal(selection.select(ranking, 0.3)[i], top)


def test_default_blending_is_the_compression_ratio():
    method = methods.get("compactor")
    assert (
        method.at_ratio(0.25).blending == 0.75
        and methods.get("compactor", blending=0.1).at_ratio(0.25).blending == 0.1
    )
    assert methods.get("adakv-compactor").at_ratio(0.5).inner.blending == 0.5
    assert methods.get("adakv-snapkv").at_ratio(0.5) == methods.get("adakv-snapkv")
    with pytest.raises(ValueError, match="blending must be >= 0, or -1"):
        methods.get("compactor", blending=-0.5)
