"""Ragged decode's additive mask (issue 15) attends exactly like the bool mask it replaces, and is built once."""

import mlx.core as mx
import numpy as np

from kvcore import select_positions
from tests.kvcore.conftest import prefill, prompt_ids


def test_additive_decode_mask_equals_bool_mask(models):
    model, tok = models["llama"]
    dense = prefill(model, prompt_ids(tok))
    T = dense[0].offset
    ragged = select_positions(dense, [[np.arange(0, T, 2), np.arange(3, T - 4)]] * len(dense))
    layer = ragged[0]
    k = mx.random.normal((1, 2, 1, 32))
    keys, values = layer.update_and_fetch(k, k)
    q = mx.random.normal((1, 4, 1, 32))
    bool_mask = layer.per_head_mask(1, 4)
    additive = layer.per_head_mask(1, 4, q.dtype)
    assert bool_mask.dtype == mx.bool_ and additive.dtype == q.dtype
    assert np.array_equal(np.isfinite(np.array(additive)), np.array(bool_mask))
    want = mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.2, mask=bool_mask)
    got = mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.2, mask=additive)
    assert np.array_equal(np.array(got), np.array(want))
    # the mask is a slice of one kept at capacity, not rebuilt per decode step
    kept = layer._decode_valid[1]
    layer.update_and_fetch(k, k)
    layer.per_head_mask(1, 4, q.dtype)
    assert layer._decode_valid[1] is kept
