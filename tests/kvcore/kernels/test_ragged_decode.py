"""Which decode steps the ragged kernel takes, and the per-head row counts it reads (made once per selection)."""

import mlx.core as mx
import numpy as np

from kvcore import quantize_cache, select_positions
from kvcore.kernels import ragged_decode
from tests.kvcore.conftest import prefill, prompt_ids


def _ragged(models):
    model, tok = models["llama"]
    dense = prefill(model, prompt_ids(tok))
    T = dense[0].offset
    heads = [np.arange(0, T, 2), np.arange(3, T - 4)]
    return dense, select_positions(dense, [heads] * len(dense)), [len(h) for h in heads]


def test_meta_names_each_heads_real_rows_then_the_padded_width(models):
    _, ragged, counts = _ragged(models)
    layer = ragged[0]
    meta = layer.ragged_meta()
    assert meta.dtype == mx.int32
    assert np.array(meta).tolist() == counts + [max(counts)] == counts + [layer.n_prefix]
    k = mx.random.normal((1, 2, 1, 32))
    layer.update_and_fetch(k, k)
    assert layer.ragged_meta() is meta  # appends do not change it: the kernel reads appended rows past it


def test_fits_one_query_over_a_ragged_float_layer_only(models):
    dense, ragged, _ = _ragged(models)
    layer = ragged[0]
    k = mx.random.normal((1, 2, 1, 32))
    keys, _ = layer.update_and_fetch(k, k)
    q = mx.random.normal((1, 4, 1, 32))
    assert ragged_decode.fits(q, keys, layer)
    assert not ragged_decode.applies(q, keys, layer)  # a CPU: the masked fallback runs
    assert not ragged_decode.fits(mx.random.normal((1, 4, 2, 32)), keys, layer)  # two queries
    assert not ragged_decode.fits(q.astype(mx.bfloat16), keys, layer)  # dtypes differ
    uniform = select_positions(dense, [np.arange(0, dense[0].offset, 2)] * len(dense))[0]
    assert not ragged_decode.fits(q, keys, uniform)  # the fast path takes it without a mask
    packed = quantize_cache(ragged, bits=4, group_size=32)[0]
    assert not ragged_decode.fits(q, keys, packed)
