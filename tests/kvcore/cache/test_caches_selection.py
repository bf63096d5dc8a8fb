"""B3-B6: kept positions per layer and per kv-head attend exactly like brute-force attention over those positions."""

import mlx.core as mx
import numpy as np
import pytest

from kvcore import copy_cache, quantize_cache, select_positions, to_sparse_all
from tests.kvcore.conftest import GROUP, prefill, prompt_ids, reference_attention, run


def _selection(kind: str, n_layers: int, n_heads: int, T: int, seed: int) -> list:
    """Indices per layer with a different count in every layer; layer 1 is left dense (None)."""
    rng = np.random.default_rng(seed)
    out = []
    for layer in range(n_layers):
        n = 3 + 4 * layer
        if layer == 1:
            out.append(None)
        elif kind == "1-D":
            out.append(np.sort(rng.choice(T, n, replace=False)))
        elif kind == "2-D":
            out.append(np.stack([np.sort(rng.choice(T, n, replace=False)) for _ in range(n_heads)]))
        else:
            out.append([np.sort(rng.choice(T, n + 5 * h, replace=False)) for h in range(n_heads)])
    return out


def _per_head(selection: list, n_heads: int) -> list:
    """The kept prompt positions as the reference wants them: None or one array per kv-head."""
    out = []
    for idx in selection:
        if idx is None or isinstance(idx, list):
            out.append(idx)
        else:
            out.append([idx] * n_heads if idx.ndim == 1 else list(idx))
    return out


def _check(model, ids, selection, appends, quant=None, atol=2e-4):
    dense = prefill(model, ids)
    n_heads = dense[0].keys.shape[1]
    sparse = select_positions(dense, selection)
    if quant is not None:
        sparse = quantize_cache(sparse, bits=quant[0], group_size=quant[1])
    reference, full = copy_cache(dense), copy_cache(dense)
    for tokens in appends:
        got = run(model, sparse, tokens)
        with reference_attention(model, reference, _per_head(selection, n_heads), len(ids), quant):
            want = run(model, reference, tokens)
        np.testing.assert_allclose(got, want, atol=atol, rtol=atol)
        assert np.abs(run(model, full, tokens) - want).max() > 50 * atol  # the selection really changes them
    return sparse


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("kind", ["1-D", "2-D", "ragged"])
def test_selection_equals_numpy_attention_over_kept_positions(models, arch, kind):
    model, tok = models[arch]
    ids = prompt_ids(tok)
    selection = _selection(kind, len(model.layers), 2, len(ids), seed=len(kind))
    sparse = _check(model, ids, selection, appends=[[5, 6, 7], [9], [10, 11]])
    assert sparse[0].is_ragged == (kind == "ragged")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_selection_equals_numpy_attention_on_dequantized_kv(models, arch, bits):
    model, tok = models[arch]
    ids = prompt_ids(tok)
    selection = _selection("ragged", len(model.layers), 2, len(ids), seed=bits)
    _check(model, ids, selection, appends=[[5, 6, 7], [9]], quant=(bits, GROUP[arch]), atol=2e-3)


def test_mx_and_numpy_indices_give_the_same_cache(models):
    model, tok = models["llama"]
    dense = prefill(model, prompt_ids(tok))
    selection = [np.array([0, 4, 9]), np.array([[1, 2], [3, 8]]), [np.array([2]), np.array([0, 6, 7])], None]
    as_mx = [
        None if s is None else [mx.array(h) for h in s] if isinstance(s, list) else mx.array(s)
        for s in selection
    ]
    a, b = select_positions(dense, selection), select_positions(dense, as_mx)
    for x, y in zip(a[:3], b[:3], strict=True):
        np.testing.assert_array_equal(np.array(x.keys), np.array(y.keys))
        assert [p.tolist() for p in x.retained_positions] == [p.tolist() for p in y.retained_positions]


def test_selecting_from_a_sparse_cache_composes(models):
    """Indices into a sparse layer are rows of its retained content; positions compose, K/V are the same rows."""
    model, tok = models["qwen3"]
    ids = prompt_ids(tok)
    dense = prefill(model, ids)
    first = [[np.array([0, 2, 4, 6, 8]), np.array([1, 3, 5])], None, np.arange(10)]
    once = select_positions(dense, first)
    run(model, once, [7, 8])  # appended rows are selectable too
    T = len(ids)
    twice = select_positions(
        once, [[np.array([1, 4, 5]), np.array([0, 2, 3, 4])], None, np.array([0, 9, 11])]
    )
    direct = select_positions(
        copy_cache(dense),
        [[np.array([2, 8]), np.array([1, 5])], None, np.array([0, 9])],
    )
    assert [p.tolist() for p in twice[0].retained_positions] == [[2, 8, T], [1, 5, T, T + 1]]
    assert twice[2].retained_positions[0].tolist() == [0, 9, T + 1]
    assert np.array_equal(np.array(twice[2].keys[..., :2, :]), np.array(direct[2].keys))
    k_dense, k_once, k_twice = (np.array(c[0].keys_and_values()[0][0]) for c in (dense, once, twice))
    appended = k_once[:, once[0].n_prefix :]  # rows of the two appended tokens, the same in every head
    np.testing.assert_array_equal(k_twice[0, :3], np.r_[k_dense[0, [2, 8]], appended[0, :1]])
    np.testing.assert_array_equal(k_twice[1, :4], np.r_[k_dense[1, [1, 5]], appended[1, :2]])
    b0 = to_sparse_all(dense)
    again = select_positions(b0, [np.arange(3)] * 3)
    assert again[0].retained_positions[0].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "entry, message",
    [
        (np.array([], dtype=np.int32), "layer 0: empty selection"),
        (
            np.array([0, 99]),
            r"layer 0 \(indices shared by every kv-head\): index 99 out of range; allowed are 0 <= index < 20",
        ),
        (np.array([-1, 3]), "index -1 out of range"),
        (np.array([2, 5, 5]), "index 5 is duplicated"),
        (np.array([4, 2]), r"not sorted \(4 before 2\)"),
        (np.array([[0, 1], [1, 0]]), r"kv-head 1: indices are not sorted"),
        (np.array([[0, 1]] * 3), "3 rows, the layer has H_kv=2 heads"),
        ([np.array([0]), np.array([1]), np.array([2])], "3 per-head index arrays, the layer has H_kv=2"),
        ([np.array([0]), np.array([], dtype=np.int64)], "kv-head 1: empty selection"),
        ([np.array([0, 3]), np.array([1, 20])], "kv-head 1: index 20 out of range"),
        (np.array([0.0, 1.0]), "must be integers"),
        (np.zeros((2, 2, 2), dtype=np.int32), "allowed are 1-D"),
        (mx.array([3, 1]), "not sorted"),
    ],
)
def test_invalid_indices_raise_clear_errors(entry, message):
    from mlx_lm.models.cache import KVCache

    layer = KVCache()
    x = mx.random.normal((1, 2, 20, 32))
    layer.update_and_fetch(x, x)
    with pytest.raises(ValueError, match=message):
        select_positions([layer, layer], [entry, None])


def test_wrong_number_of_layers_and_offsets_raise(models):
    model, tok = models["llama"]
    dense = prefill(model, prompt_ids(tok))
    with pytest.raises(ValueError, match="indices_per_layer has 2 entries, the cache has 4 layers"):
        select_positions(dense, [np.arange(2)] * 2)
    with pytest.raises(ValueError, match="logical_offset=-1"):
        select_positions(dense, [np.arange(2)] * 4, logical_offset=-1)
    moved = select_positions(dense, [np.arange(2)] * 4, logical_offset=100)
    run(model, moved, [1])
    assert moved[0].retained_positions[0].tolist() == [0, 1, 100]


def test_trusted_selection_equals_validated(loaded_models):
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    from kvcore import select_positions

    model, tok = loaded_models["llama"]
    cache = make_prompt_cache(model)
    mx.eval(
        model(mx.array([tok.encode("def main(argv): return the quick brown fox jumps over")]), cache=cache)
    )
    T = cache[0].offset
    rng = np.random.default_rng(1)
    sel = [np.sort(rng.permutation(T)[: T // 3]) for _ in cache]
    sel[1] = np.stack([np.sort(rng.permutation(T)[: T // 2]) for _ in range(2)])
    sel[2] = [np.sort(rng.permutation(T)[:k]) for k in (2, T - 1)]
    checked = select_positions(cache, sel)
    trusted = select_positions(cache, sel, validate=False)
    for a, b in zip(checked, trusted, strict=True):
        ka, va = a.keys_and_values()
        kb, vb = b.keys_and_values()
        assert mx.array_equal(ka, kb).item() and mx.array_equal(va, vb).item()
        assert [p.tolist() for p in a.retained_positions] == [p.tolist() for p in b.retained_positions]
