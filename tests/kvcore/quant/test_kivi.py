"""KIVI: keys per channel (Kᵀ packed along tokens) against a NumPy reading of the codes, values per token, a float
residual that keeps token groups whole; attention on the packed form equal to attention over the dequantized body
and the float rows; bytes = codes + scales + biases + residual floats; decoding packs a group when one fills."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base as mlx_base
from mlx_lm.models.cache import KVCache

from kvcore import cache_tensor_bytes
from kvcore.cache.kivi import KiviKVCache, kivi_cache
from kvcore.quant import get
from tests.kvcore.conftest import _attention_replaced, prefill, prompt_ids, run

D, H = 64, 2


def _numpy_affine(parts, bits: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """mx affine parts read in NumPy: codes a little-endian bit stream of uint32 words; x = scale·code + bias."""
    words, scales, biases = (np.array(p, dtype=np.float64) if i else np.array(p) for i, p in enumerate(parts))
    stream = np.unpackbits(words.astype("<u4").view(np.uint8), axis=-1, bitorder="little")
    n = stream.shape[-1] // bits
    codes = stream[..., : n * bits].reshape(*stream.shape[:-1], n, bits)
    codes = (codes.astype(np.int64) << np.arange(bits)).sum(-1)
    return codes * np.repeat(scales, group, -1) + np.repeat(biases, group, -1), np.repeat(scales, group, -1)


def _layer(n: int, seed: int = 0) -> KVCache:
    rng = np.random.default_rng(seed)
    k = rng.normal(size=(1, H, n, D)).astype(np.float32)
    k[..., 3] *= 20  # an outlier channel: per-channel groups are the point
    c = KVCache()
    c.update_and_fetch(mx.array(k), mx.array(rng.normal(size=(1, H, n, D)).astype(np.float32)))
    return c


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_keys_are_packed_per_channel_along_tokens(bits):
    scheme = get("kivi")
    k = np.random.default_rng(1).normal(size=(1, H, 64, D)).astype(np.float32)
    parts = scheme.pack_keys(mx.array(k), bits)
    assert parts[0].shape == (1, H, D, 64 * bits // 32)  # Kᵀ: head_dim rows of 64 tokens' codes
    assert parts[1].shape == parts[2].shape == (1, H, D, 2)  # a scale and a bias per channel and token group
    deq, scale = _numpy_affine(parts, bits, 32)
    kt = np.swapaxes(k, -1, -2).astype(np.float64)
    # each (channel, token group) alone, as a row of 32: its scale and bias are the group's
    rows = mx.quantize(mx.array(kt.reshape(-1, 32).astype(np.float32)), group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(parts[1]).reshape(-1), np.array(rows[1]).reshape(-1))
    np.testing.assert_array_equal(np.array(parts[2]).reshape(-1), np.array(rows[2]).reshape(-1))
    assert np.all(np.abs(deq - kt) <= np.abs(scale) * 1.5 + 1e-5)
    np.testing.assert_allclose(np.array(scheme.unpack_keys(parts, bits)), np.swapaxes(deq, -1, -2), atol=1e-5)
    v_deq, _ = _numpy_affine(scheme.pack(mx.array(k), bits), bits, 32)  # values: per token, along head_dim
    np.testing.assert_allclose(
        np.array(scheme.unpack(scheme.pack(mx.array(k), bits), bits)), v_deq, atol=1e-5
    )


def _reference(cache: KiviKVCache, q: mx.array, scale: float) -> mx.array:
    body_k, body_v = cache.dequantized_body()
    res_k, res_v = cache.residual.keys_and_values()
    k = mx.concatenate([body_k.astype(mx.float32), res_k], axis=2)
    v = mx.concatenate([body_v.astype(mx.float32), res_v], axis=2)
    mask = "causal" if q.shape[2] > 1 else None
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


@pytest.mark.parametrize("kb, vb", [(2, 2), (4, 2), (16, 4), (4, 16)])
def test_genuine_attention_equals_dequantize_then_attend_across_a_group_boundary(kb, vb):
    scheme = get("kivi:residual=8")
    cache = KiviKVCache.from_float(_layer(8 + 32 + 31), scheme, kb, vb)  # one group packed, 39 float rows
    assert (cache.n_body, cache.residual.size()) == (32, 39)
    rng = np.random.default_rng(5)
    q = mx.array(rng.normal(size=(1, 2 * H, 1, D)).astype(np.float32))  # GQA: 2 query heads per kv-head
    np.testing.assert_allclose(
        np.array(cache.attend(q, None, None, 0.125)), np.array(_reference(cache, q, 0.125)), atol=1e-4
    )
    new = [mx.array(rng.normal(size=(1, H, 1, D)).astype(np.float32)) for _ in range(2)]
    cache.update_and_fetch(*new)  # 40 float rows = residual + a whole group: the oldest 32 are packed
    assert (cache.n_body, cache.residual.size(), cache.offset) == (64, 8, 72)
    np.testing.assert_array_equal(cache.body_positions, np.tile(np.arange(64), (H, 1)))
    np.testing.assert_array_equal(cache.residual.retained_positions[0], np.arange(64, 72))
    np.testing.assert_allclose(
        np.array(cache.attend(q, None, None, 0.125)), np.array(_reference(cache, q, 0.125)), atol=1e-4
    )
    q3 = mx.array(rng.normal(size=(1, 2 * H, 3, D)).astype(np.float32))
    cache.update_and_fetch(*(mx.array(rng.normal(size=(1, H, 3, D)).astype(np.float32)) for _ in range(2)))
    np.testing.assert_allclose(
        np.array(cache.attend(q3, None, None, 0.125)), np.array(_reference(cache, q3, 0.125)), atol=1e-4
    )


@pytest.mark.parametrize("kb, vb", [(2, 2), (4, 3)])
def test_stored_bytes_are_codes_scales_biases_and_residual_floats(kb, vb):
    cache = kivi_cache([_layer(8 + 64 + 5)], "kivi:residual=8", kb, vb)[0]
    n_body, n_res, g, s = 64, 13, 32, 4  # float32 scales, biases and residual rows
    keys = H * D * (n_body * kb // 8 + n_body // g * 2 * s)
    values = H * n_body * (D * vb // 8 + D // g * 2 * s)
    assert cache.nbytes == cache_tensor_bytes([cache]) == keys + values + 2 * H * n_res * D * s


def test_model_decode_on_the_kivi_cache_equals_attention_over_its_dequantized_body(models):
    model, tok = models["llama"]
    ids = prompt_ids(tok) * 2  # longer than a group of 32 and the residual
    T, residual = len(ids), 4
    n_body = (T - residual) // 32 * 32
    assert n_body > 0
    cache = kivi_cache(prefill(model, ids), f"kivi:residual={residual}", 2, 4)
    assert all(isinstance(c, KiviKVCache) and c.n_body == n_body for c in cache)
    got = np.concatenate([run(model, cache, [5, 6, 7]), run(model, cache, [8])])
    scheme = get("kivi")

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        k = mx.concatenate(
            [scheme.unpack_keys(scheme.pack_keys(keys[:, :, :n_body], 2), 2), keys[:, :, n_body:]], 2
        )
        v = mx.concatenate(
            [scheme.unpack(scheme.pack(values[:, :, :n_body], 4), 4), values[:, :, n_body:]], 2
        )
        return mlx_base.scaled_dot_product_attention(queries, k, v, cache, scale, mask, sinks)

    dense = prefill(model, ids)
    with _attention_replaced(model, sdpa):
        want = np.concatenate([run(model, dense, [5, 6, 7]), run(model, dense, [8])])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)


def test_a_residual_longer_than_the_prompt_is_refused_in_one_line():
    with pytest.raises(
        ValueError, match=r"^kivi: residual=128 is longer than the 40 positions to store: use residual <= 40"
    ):
        kivi_cache([_layer(40)], "kivi", 2)


def test_cli_compress_with_kivi_reports_its_error_and_refuses_fp_recent(
    model_dirs, prompt_file, tmp_path, capsys
):
    import csv
    import json

    from kvcore.cli.main import main

    base = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "--prompt-file",
        str(prompt_file),
        "--tokens",
        "3",
    ]
    flags = ["--quant", "kivi:residual=8", "--bits", "2", "--group-size", "32", "--ratio", "1", "--json"]
    assert main([*base, *flags, "--csv", str(tmp_path / "stats.csv")]) == 0
    summary = json.loads(capsys.readouterr().out)
    with open(tmp_path / "stats.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(
        float(r["key_rmse"]) > 0 and float(r["value_rmse"]) > 0 for r in rows
    )  # the packed body's error
    assert (summary["quant_scheme"], summary["execution"], summary["key_bits"]) == (
        "kivi:residual=8",
        "genuine",
        2,
    )
    assert main([*base, *flags, "--fp-recent", "4"]) == 2
    assert (
        "kivi:residual=8 keeps its own float residual (kivi:residual=R): leave fp_recent at 0"
        in capsys.readouterr().err
    )


def _per_head_reference(cache: KiviKVCache, k_all, v_all, q: mx.array, scale: float) -> np.ndarray:
    """Each kv-head alone: its dequantized body rows, then the float rows of the positions its residual holds
    (read from every token's keys and values `k_all`/`v_all` [H, T, D]), one softmax (one new token)."""
    body_k, body_v = (np.array(x.astype(mx.float32)) for x in cache.dequantized_body())
    qs, n_q = np.array(q) * scale, q.shape[1] // H
    out = np.zeros(qs.shape, dtype=np.float64)
    for h, positions in enumerate(cache.residual.retained_positions):
        k = np.concatenate([body_k[0, h], k_all[h, positions]])
        v = np.concatenate([body_v[0, h], v_all[h, positions]])
        for j in range(h * n_q, (h + 1) * n_q):
            w = np.exp(qs[0, j] @ k.T - (qs[0, j] @ k.T).max())
            out[0, j] = (w / w.sum()) @ v
    return out


def test_a_per_head_selection_of_different_counts_is_packed_attended_and_counted():
    from kvcore.cache.sparse import select_positions

    kept = [np.arange(0, 100, 1), np.sort(np.r_[np.arange(0, 60, 2), np.arange(60, 100)])]  # 100 and 70 rows
    dense = _layer(100, seed=3)
    k_all, v_all = np.array(dense.keys[0, :, :100]), np.array(dense.values[0, :, :100])
    layer = select_positions([dense], [kept])[0]
    cache = KiviKVCache.from_float(layer, get("kivi:residual=8"), 4, 2)
    assert cache.n_body == 32 and list(cache.residual.kept_counts) == [68, 38]  # the fewer's whole groups
    for h in range(H):
        np.testing.assert_array_equal(cache.retained_positions[h], kept[h])
    g, s = 32, 4
    keys = H * D * (32 * 4 // 8 + 32 // g * 2 * s)
    values = H * 32 * (D * 2 // 8 + D // g * 2 * s)
    assert (
        cache.nbytes == keys + values + 2 * H * 68 * D * s
    )  # the residual stored padded to its longest head
    rng = np.random.default_rng(7)
    q = mx.array(rng.normal(size=(1, 2 * H, 1, D)).astype(np.float32))
    np.testing.assert_allclose(
        np.array(cache.attend(q, None, None, 0.125)),
        _per_head_reference(cache, k_all, v_all, q, 0.125),
        atol=1e-4,
    )
    for _ in range(40):  # the fewer head's 38 float rows reach 8 + 32 twice: two groups more for every head
        new_k, new_v = (rng.normal(size=(1, H, 1, D)).astype(np.float32) for _ in range(2))
        cache.update_and_fetch(mx.array(new_k), mx.array(new_v))
        k_all, v_all = np.concatenate([k_all, new_k[0]], 1), np.concatenate([v_all, new_v[0]], 1)
    assert cache.n_body == 96 and list(cache.residual.kept_counts) == [44, 14]
    np.testing.assert_array_equal(cache.retained_positions[1], np.r_[kept[1], np.arange(100, 140)])
    np.testing.assert_allclose(
        np.array(cache.attend(q, None, None, 0.125)),
        _per_head_reference(cache, k_all, v_all, q, 0.125),
        atol=1e-4,
    )


def test_adakv_with_kivi_compresses_per_head_counts_and_regenerates(model_dirs):
    from kvcore.engine.session import CompressionConfig, Session

    session = Session.load(str(model_dirs["llama"]))
    session.prefill("def main(argv):\n    return sum(x * x for x in argv)\n" * 6, n_tokens=3)
    config = CompressionConfig("adakv", 0.75, bits=2, quant="kivi:residual=4", group_size=32)
    state = session.compress(config)
    counts = state.kept.sum(axis=2)  # [L, H_kv]
    assert any(len(set(row)) > 1 for row in counts.tolist())  # adakv's heads keep different counts
    for layer, c in enumerate(state.cache):
        assert isinstance(c, KiviKVCache) and list(c.kept_counts) == counts[layer].tolist()
        assert c.n_body == (min(counts[layer]) - 4) // 32 * 32 > 0
    assert state.bytes_compressed == cache_tensor_bytes(state.cache)
    assert np.array_equal(np.isnan(state.quant_error), ~state.kept)  # the error view: kept positions only
    for layer, c in enumerate(state.cache):  # each head's float residual exact, its packed body not
        for h, positions in enumerate(c.retained_positions):
            errors = state.quant_error[layer, h, positions]
            assert np.all(errors[c.n_body :] == 0) and np.all(errors[: c.n_body] > 0)
    metrics = session.regenerate(state).metrics
    assert np.isfinite(metrics["kl_mean"]) and 0.0 <= metrics["agreement"] <= 1.0
