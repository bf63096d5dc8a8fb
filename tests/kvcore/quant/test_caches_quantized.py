"""B2: packed quantization decodes like mlx-lm's own quantized KV path; quantization settings are validated."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import stream_generate
from mlx_lm.models.cache import KVCache
from mlx_lm.sample_utils import make_sampler

from kvcore import SparseQuantizedKVCache, quantize_cache, select_positions, to_sparse_all
from tests.kvcore.conftest import GROUP, greedy, prefill, prompt_ids


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("bits", [8, 4])
def test_b2_decode_matches_mlx_lm_quantized_kv(models, arch, bits):
    model, tok = models[arch]
    ids = prompt_ids(tok)
    group = GROUP[arch]
    expected = [
        r.token
        for r in stream_generate(
            model,
            tok,
            ids,
            max_tokens=16,
            sampler=make_sampler(temp=0.0),
            kv_bits=bits,
            kv_group_size=group,
            quantized_kv_start=0,
        )
    ]
    # mlx-lm's schedule: prefill all but the last prompt token, quantize, then feed that token.
    cache = quantize_cache(prefill(model, ids[:-1]), bits=bits, group_size=group)
    assert all(type(c) is SparseQuantizedKVCache and (c.bits, c.group_size) == (bits, group) for c in cache)
    assert greedy(model, cache, ids[-1], 16) == expected


def test_quantizing_a_ragged_selection_keeps_its_layout(models):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    sparse = select_positions(
        prefill(model, ids), [[np.array([0, 3]), np.arange(6)], None, np.arange(4), None]
    )
    quantized = quantize_cache(sparse, bits=4, group_size=32)
    # dense layers are quantized too, keeping every position (B2 wherever no selection was made)
    assert (
        type(quantized[1]) is SparseQuantizedKVCache and quantized[1].kept_counts.tolist() == [len(ids)] * 2
    )
    assert quantized[0].is_ragged and quantized[0].kept_counts.tolist() == [2, 6]
    assert [p.tolist() for p in quantized[0].retained_positions] == [[0, 3], list(range(6))]
    assert quantized[0].per_head_mask(1).shape == (1, 2, 1, 6)
    assert quantized[2].offset == len(ids)


def test_quantize_a_dense_layer_is_quantized_to_b0():
    layer = KVCache()
    x = mx.random.normal((1, 2, 5, 64))
    layer.update_and_fetch(x, x)
    (q,) = quantize_cache([layer], bits=8, group_size=64)
    k, _ = q.keys_and_values()
    back = mx.dequantize(*k, group_size=64, bits=8)
    assert q.retained_positions[0].tolist() == list(range(5))
    np.testing.assert_allclose(np.array(back), np.array(x), atol=0.05)


@pytest.mark.parametrize(
    "bits, group, message",
    [
        (7, 32, r"bits=7 is not supported: mx.quantize allows bits in \(2, 3, 4, 5, 6, 8\)"),
        (1, 32, "bits=1 is not supported"),
        (4, 48, r"group_size=48 is not supported: mx.quantize allows group sizes \(32, 64, 128\)"),
        (4, 64, r"group_size=64 does not divide head_dim=32.*use one of \[32\]"),
        (4, 128, "group_size=128 does not divide head_dim=32"),
    ],
)
def test_invalid_quantization_settings_raise(bits, group, message):
    layer = KVCache()
    x = mx.random.normal((1, 2, 4, 32))
    layer.update_and_fetch(x, x)
    with pytest.raises(ValueError, match=message):
        quantize_cache(to_sparse_all([layer]), bits=bits, group_size=group)
    with pytest.raises(ValueError, match=message):
        SparseQuantizedKVCache(group_size=group, bits=bits).update_and_fetch(x, x)


def test_already_quantized_layers_are_refused():
    layer = KVCache()
    x = mx.random.normal((1, 2, 4, 32))
    layer.update_and_fetch(x, x)
    once = quantize_cache([layer], bits=4, group_size=32)
    with pytest.raises(ValueError, match="layer 0: already quantized \\(bits=4, group_size=32\\)"):
        quantize_cache(once, bits=8, group_size=32)
