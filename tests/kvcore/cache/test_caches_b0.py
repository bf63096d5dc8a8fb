"""B0 (every position in the sparse form) decodes exactly like mlx-lm; buffers, positions, branches, pass-through."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import stream_generate
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache
from mlx_lm.sample_utils import make_sampler

from kvcore import (
    SparseKVCache,
    SparseQuantizedKVCache,
    compressible_layers,
    copy_cache,
    incompressible_reason,
    quantize_cache,
    select_positions,
    to_sparse_all,
)
from tests.kvcore.conftest import greedy, prefill, prompt_ids, run


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_b0_decode_matches_mlx_lm_stream_generate(models, arch):
    model, tok = models[arch]
    ids = prompt_ids(tok)
    expected = [
        r.token for r in stream_generate(model, tok, ids, max_tokens=32, sampler=make_sampler(temp=0.0))
    ]
    cache = to_sparse_all(prefill(model, ids[:-1]))
    assert all(type(c) is SparseKVCache for c in cache)
    assert greedy(model, cache, ids[-1], 32) == expected


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_b0_next_token_logits_bit_identical_to_dense(models, arch):
    model, tok = models[arch]
    ids = prompt_ids(tok)
    dense = prefill(model, ids)
    sparse = to_sparse_all(dense)
    for tokens in ([5], [7, 8, 9], [11]):
        np.testing.assert_array_equal(run(model, sparse, tokens), run(model, dense, tokens))


def test_masks_are_causal_strings_never_sized_arrays(models):
    model, tok = models["llama"]
    cache = to_sparse_all(prefill(model, prompt_ids(tok)))
    assert cache[0].make_mask(1) is None
    assert cache[0].make_mask(4) == "causal"
    assert cache[0].per_head_mask(1) is None
    with pytest.raises(ValueError, match="window_size"):
        cache[0].make_mask(4, window_size=8)


@pytest.mark.parametrize("quantized", [False, True])
def test_appends_write_into_a_buffer_grown_in_steps_of_256(quantized):
    h, d, n = 2, 32, 10
    src = KVCache()
    src.update_and_fetch(mx.ones((1, h, n, d)), mx.ones((1, h, n, d)))
    cache = select_positions([src], [[np.array([1, 4]), np.array([0, 2, 5, 9])]])
    if quantized:
        cache = quantize_cache(cache, bits=4, group_size=32)
    layer = cache[0]

    def capacity():
        return (layer.keys[0] if quantized else layer.keys).shape[2]

    assert capacity() == 4
    layer.update_and_fetch(mx.ones((1, h, 1, d)), mx.ones((1, h, 1, d)))
    assert capacity() == 4 + 256
    for _ in range(255):
        buffer = layer.keys[0] if quantized else layer.keys
        layer.update_and_fetch(mx.ones((1, h, 1, d)), mx.ones((1, h, 1, d)))
        assert (layer.keys[0] if quantized else layer.keys) is buffer  # written in place, no new layer array
    assert capacity() == 4 + 256
    layer.update_and_fetch(mx.ones((1, h, 3, d)), mx.ones((1, h, 3, d)))
    assert capacity() == 4 + 512
    k, _ = layer.keys_and_values()
    assert (k[0] if quantized else k).shape[2] == 4 + 259
    assert layer.kept_counts.tolist() == [2 + 259, 4 + 259]
    assert layer.offset == n + 259


def test_retained_positions_follow_appends_lazily(models):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    T = len(ids)
    heads = [np.array([0, 3, 7]), np.array([1, 2, 5, 8, 13])]
    cache = select_positions(
        prefill(model, ids), [heads, np.arange(0, T, 3), None, np.array([[0, 1], [2, 3]])]
    )
    run(model, cache, [1, 2])
    run(model, cache, [3])
    new = np.arange(T, T + 3)
    layer = cache[0]
    assert [p.tolist() for p in layer.retained_positions] == [np.r_[h, new].tolist() for h in heads]
    assert layer.kept_counts.tolist() == [6, 8]
    assert layer.n_kept == 8  # padded width
    assert all(p.dtype == np.int32 for p in layer.retained_positions)
    assert cache[1].retained_positions[1].tolist() == np.r_[np.arange(0, T, 3), new].tolist()
    assert type(cache[2]) is KVCache and cache[2].offset == T + 3
    assert cache[3].retained_positions[1].tolist() == [2, 3, *new]


def test_copy_cache_branches_are_independent(models):
    model, tok = models["qwen3"]
    ids = prompt_ids(tok)
    base = select_positions(prefill(model, ids), [[np.arange(4), np.arange(9)], np.arange(6), None])
    base = quantize_cache(base, bits=8, group_size=64)[:1] + base[1:]
    a, b = copy_cache(base), copy_cache(base)
    before = [np.array(x) for c in b[:2] for x in c.keys_and_values()[1][:1]] + [np.array(b[2].keys)]
    logits_a = run(model, a, [3, 4])
    run(model, a, [5])
    after = [np.array(x) for c in b[:2] for x in c.keys_and_values()[1][:1]] + [np.array(b[2].keys)]
    for x, y in zip(before, after, strict=True):
        np.testing.assert_array_equal(x, y)
    assert [c.offset for c in b] == [len(ids)] * 3
    assert [c.offset for c in a] == [len(ids) + 3] * 3
    np.testing.assert_array_equal(run(model, b, [3, 4]), logits_a)
    np.testing.assert_array_equal(run(model, base, [3, 4]), logits_a)


def _mixed_cache():
    dense, rotating, ssm = KVCache(), RotatingKVCache(max_size=8, keep=2), ArraysCache(size=2)
    x = mx.random.normal((1, 2, 6, 32))
    dense.update_and_fetch(x, x)
    rotating.update_and_fetch(x, x)
    ssm[0] = mx.zeros((1, 3))
    return [dense, rotating, ssm, KVCache()]


def test_layers_that_are_not_plain_kv_caches_pass_through():
    cache = _mixed_cache()
    assert compressible_layers(cache) == [True, False, False, False]
    assert "sliding-window" in incompressible_reason(cache[1])
    assert "SSM" in incompressible_reason(cache[2])
    assert "empty" in incompressible_reason(cache[3])
    for out in (
        to_sparse_all(cache),
        quantize_cache(cache, bits=4, group_size=32),
        select_positions(cache, [np.array([0, 5]), None, None, None]),
    ):
        assert type(out[0]) in (SparseKVCache, SparseQuantizedKVCache)
        assert out[1:] == cache[1:] and all(o is c for o, c in zip(out[1:], cache[1:], strict=True))
    with pytest.raises(ValueError, match="layer 1: cannot select.*RotatingKVCache.*pass None"):
        select_positions(cache, [None, np.array([0]), None, None])
    copies = copy_cache(cache)
    assert [type(c) for c in copies] == [type(c) for c in cache]
    assert copies[1] is not cache[1] and copies[1].keys is not cache[1].keys
    snapshot = np.array(cache[1].keys)
    copies[1].update_and_fetch(mx.ones((1, 2, 1, 32)), mx.ones((1, 2, 1, 32)))
    np.testing.assert_array_equal(np.array(cache[1].keys), snapshot)
    assert copies[2].cache is not cache[2].cache


def test_mlx_lm_generate_loop_and_from_state_accept_a_ragged_cache(models):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    selection = [[np.arange(3), np.arange(8)], np.arange(5), None, np.array([[0, 2], [1, 3]])]
    ours = select_positions(prefill(model, ids[:-1]), selection)
    theirs = [type(c).from_state(c.state) for c in copy_cache(ours)]
    assert [c.kept_counts.tolist() for c in theirs[:2]] == [c.kept_counts.tolist() for c in ours[:2]]
    expected = greedy(model, ours, ids[-1], 8)
    got = [
        r.token
        for r in stream_generate(
            model, tok, [ids[-1]], max_tokens=8, sampler=make_sampler(temp=0.0), prompt_cache=theirs
        )
    ]
    assert got == expected
