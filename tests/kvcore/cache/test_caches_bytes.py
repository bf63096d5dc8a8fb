"""Bytes are measured from the stored arrays (logical content, never spare buffer capacity)."""

import mlx.core as mx
import numpy as np

from kvcore import cache_tensor_bytes, dense_bytes_formula, quantize_cache, select_positions, to_sparse_all
from tests.kvcore.conftest import prefill, prompt_ids, run


def _stored(cache) -> int:
    total = 0
    for c in cache:
        for x in c.keys_and_values():
            total += sum(p.nbytes for p in (x if isinstance(x, tuple) else (x,)))
    return total


def test_dense_bytes_equal_the_formula_and_b0_equals_dense(models):
    for model, tok in models.values():
        ids = prompt_ids(tok)
        dense = prefill(model, ids)
        _, h, _, d = dense[0].keys.shape
        formula = dense_bytes_formula(len(model.layers), len(ids), h, d, 4)
        assert dense[0].keys.shape[2] == 256  # the buffer is larger than its content
        assert cache_tensor_bytes(dense) == formula
        assert cache_tensor_bytes(to_sparse_all(dense)) == formula


def test_sparse_and_quantized_bytes_are_the_stored_arrays(models):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    dense = prefill(model, ids)
    _, h, _, d = dense[0].keys.shape
    sparse = select_positions(
        dense, [np.arange(5), np.arange(7), np.array([[0, 1, 2], [4, 5, 6]]), np.arange(2)]
    )
    assert cache_tensor_bytes(sparse) == _stored(sparse) == 2 * h * d * 4 * (5 + 7 + 3 + 2)
    quantized = quantize_cache(sparse, bits=4, group_size=32)
    per_row = h * (d * 4 // 8 + 2 * (d // 32) * 4)  # packed words + fp32 scales and biases per group
    assert cache_tensor_bytes(quantized) == _stored(quantized) == 2 * per_row * (5 + 7 + 3 + 2)
    run(model, sparse, [1])
    run(model, quantized, [1])
    assert sparse[0].keys.shape[2] == 5 + 256  # capacity grew, the count did not
    assert cache_tensor_bytes(sparse) == _stored(sparse) == 2 * h * d * 4 * (6 + 8 + 4 + 3)
    assert cache_tensor_bytes(quantized) == _stored(quantized) == 2 * per_row * (6 + 8 + 4 + 3)
    assert cache_tensor_bytes(quantized) < cache_tensor_bytes(sparse)


def test_ragged_bytes_are_the_real_padded_storage_and_below_dense(models):
    model, tok = models["qwen3"]
    ids = prompt_ids(tok)
    dense = prefill(model, ids)
    _, h, _, d = dense[0].keys.shape
    ragged = [[np.arange(2), np.arange(9)], [np.array([0]), np.array([1, 2])], [np.arange(4), np.arange(3)]]
    sparse = select_positions(dense, ragged)
    assert cache_tensor_bytes(sparse) == _stored(sparse) == 2 * h * d * 4 * (9 + 2 + 4)
    assert cache_tensor_bytes(sparse) < cache_tensor_bytes(dense)
    assert (
        sum(int(c.kept_counts.sum()) for c in sparse) == 11 + 3 + 7
    )  # real rows, below the padded 2*(9+2+4)


def test_empty_layers_cost_nothing():
    from mlx_lm.models.cache import KVCache

    assert cache_tensor_bytes([KVCache()]) == 0
    assert dense_bytes_formula(2, 10, 4, 8, 2, B=3) == 2 * 3 * 2 * 10 * 4 * 8 * 2
    x = mx.zeros((1, 1, 3, 32))
    layer = KVCache()
    layer.update_and_fetch(x, x)
    assert cache_tensor_bytes([layer]) == 2 * 3 * 32 * 4
