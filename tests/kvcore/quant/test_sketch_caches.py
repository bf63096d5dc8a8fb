"""TurboQuant and QJL in the packed cache: stored bytes equal their formula (codes, sign bits, norms, affine
values), attention on the dequantized copy (execution = simulated) equals attention over the dequantized rows at
decode, with a float residual too, eviction then packing, and `kvlens compress --quant …` and a Session end to
end."""

import csv
import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base as mlx_base

from kvcore import cache_tensor_bytes, quantize_cache
from kvcore.cache import file_checks
from kvcore.cache import files as cache_io
from kvcore.cache.residual import ResidualKVCache, split_select
from kvcore.cache.sparse import scheme_for, select_positions
from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig, Session
from kvcore.quant import get
from tests.kvcore.conftest import _attention_replaced, prefill, prompt_ids, run

HALF = 2  # bytes of a float16 norm


def row_bytes(
    quant: str, bits: int, d: int, dtype_size: int = 4, group: int = 32, values: bool = False
) -> int:
    """Stored bytes of one row of one kv-head, by the scheme's formula."""
    if quant == "turboquant":
        return d * bits // 8 + HALF  # codes, norm
    if quant == "turboquant_prod":
        return d * (bits - 1) // 8 + d // 8 + 2 * HALF  # MSE codes, residual sign bits, norm, residual norm
    if values:  # qjl's values: affine codes, a scale and a bias per group in the rows' dtype
        return d * bits // 8 + 2 * (d // group) * dtype_size
    return bits * d // 8 + HALF  # qjl's keys: m = bits·d sign bits, norm


SCHEMES = [("turboquant", 3), ("turboquant_prod", 3), ("qjl", 2)]


@pytest.mark.parametrize("quant, bits", SCHEMES)
def test_stored_bytes_equal_the_formula_after_eviction(models, quant, bits):
    """Select (every other position, then per-head counts), then pack what is kept: bytes are the formula's."""
    model, tok = models["llama"]
    dense = prefill(model, prompt_ids(tok))
    _, heads, T, d = dense[0].keys[..., : dense[0].offset, :].shape
    kept = np.arange(0, T, 2)
    packed = quantize_cache(
        select_positions(dense, [kept] * len(dense)), bits=bits, group_size=32, quant=quant
    )
    per_row = row_bytes(quant, bits, d) + row_bytes(quant, bits, d, values=True)
    assert cache_tensor_bytes(packed) == len(dense) * heads * len(kept) * per_row
    arrays = [a for c in packed for side in c.keys_and_values() for a in side]
    assert sum(a.nbytes for a in arrays) == cache_tensor_bytes(packed)  # the formula is what the arrays hold
    assert all(c.quant == quant and c.scheme.execution == "simulated" for c in packed)


@pytest.mark.parametrize("quant, kb, vb", [("turboquant", 3, 3), ("turboquant_prod", 4, 2), ("qjl", 3, 16)])
def test_decode_equals_attention_over_the_dequantized_rows(models, quant, kb, vb):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    T = len(ids)
    heads = [np.arange(0, T, 2), np.arange(1, T, 3)]  # ragged: the kv-heads keep different counts
    sel = select_positions(prefill(model, ids), [heads] * len(model.layers))
    packed = quantize_cache(sel, bits=kb, group_size=32, value_bits=vb, quant=quant)
    got = np.concatenate([run(model, packed, [5, 6, 7]), run(model, packed, [8])])  # several tokens, then one
    scheme = scheme_for(quant, 32)

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        """Every row as the cache packs it, attended in float under the ragged layer's own mask."""
        k = scheme.unpack(scheme.pack(keys, kb), kb).astype(keys.dtype)
        v = values if vb == 16 else scheme.unpack(scheme.pack_values(values, vb), vb).astype(values.dtype)
        head_mask = cache.per_head_mask(queries.shape[2], queries.shape[1])
        mask = mask if head_mask is None else head_mask
        return mlx_base.scaled_dot_product_attention(queries, k, v, cache, scale, mask, sinks)

    dense = select_positions(prefill(model, ids), [heads] * len(model.layers))
    with _attention_replaced(model, sdpa):
        want = np.concatenate([run(model, dense, [5, 6, 7]), run(model, dense, [8])])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)


def test_decode_with_a_float_residual_equals_attention_over_dequantized_body_and_float_rows(models):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    T, n_sink, recent = len(ids), 2, 3
    packed = quantize_cache(prefill(model, ids), bits=3, group_size=32, quant="turboquant")
    cache = split_select(prefill(model, ids), packed, [np.arange(T)] * len(packed), T, n_sink, recent)
    assert all(isinstance(c, ResidualKVCache) and c.quant == "turboquant" for c in cache)
    got = np.concatenate([run(model, cache, [5, 6, 7]), run(model, cache, [8])])
    scheme = get("turboquant")

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        rows = np.arange(keys.shape[2])
        exact = mx.array(((rows < n_sink) | (rows >= T - recent))[:, None])
        k, v = (
            mx.where(exact, x, scheme.unpack(scheme.pack(x, 3), 3).astype(x.dtype)) for x in (keys, values)
        )
        return mlx_base.scaled_dot_product_attention(queries, k, v, cache, scale, mask, sinks)

    dense = prefill(model, ids)
    with _attention_replaced(model, sdpa):
        want = np.concatenate([run(model, dense, [5, 6, 7]), run(model, dense, [8])])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)


@pytest.mark.parametrize("quant, bits", SCHEMES)
def test_cli_compress_json_bytes_are_the_stored_formula(
    model_dirs, prompt_file, tmp_path, capsys, quant, bits
):
    out = tmp_path / "s.csv"
    flags = f"--prompt-file {prompt_file} --method snapkv --ratio 0.5 --quant {quant} --bits {bits} --group-size 32"
    args = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        *flags.split(),
        "--tokens",
        "3",
        "--csv",
        str(out),
    ]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["quant_scheme"], summary["execution"], summary["key_bits"]) == (quant, "simulated", bits)
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["quant_scheme"], r["execution"]) for r in rows} == {(quant, "simulated")}
    d = 32  # the llama test model's head_dim
    per_row = row_bytes(quant, bits, d) + row_bytes(quant, bits, d, values=True)
    assert all(int(r["bytes_compressed"]) == int(r["tokens_kept"]) * per_row for r in rows)
    assert summary["bytes_compressed_total"] == sum(int(r["tokens_kept"]) * per_row for r in rows)


def test_session_compresses_and_regenerates_with_turboquant(model_dirs):
    session = Session.load(str(model_dirs["llama"]))
    session.prefill("def main(argv):\n    return sum(x * x for x in argv)\n" * 2, n_tokens=4)
    config = CompressionConfig("snapkv", 0.5, bits=3, value_bits=2, quant="turboquant_prod", group_size=64)
    assert config.group_size == 1 and config.describe()["execution"] == "simulated"
    state = session.compress(config)
    per_row = row_bytes("turboquant_prod", 3, 32) + row_bytes("turboquant_prod", 2, 32)
    kept = int(state.kept.sum())
    assert state.bytes_compressed == kept * per_row == cache_tensor_bytes(state.cache)
    assert all(r["execution"] == "simulated" and r["key_rmse"] > 0 for r in state.stats_rows)
    metrics = session.regenerate(state).metrics
    assert np.isfinite(metrics["kl_mean"]) and 0.0 <= metrics["agreement"] <= 1.0


@pytest.mark.parametrize("quant, kb, vb", [("turboquant", 3, 3), ("turboquant_prod", 2, 16), ("qjl", 2, 4)])
def test_files_keep_the_scheme_and_refuse_parts_of_another_layout(models, tmp_path, quant, kb, vb):
    model, tok = models["llama"]
    packed = quantize_cache(
        prefill(model, prompt_ids(tok)), bits=kb, value_bits=vb, group_size=32, quant=quant
    )
    path = tmp_path / "cache.safetensors"
    cache_io.save_cache(path, packed)
    loaded, _ = cache_io.load_cache(path)
    assert all(c.quant == quant and (c.bits, c.value_bits) == (kb, vb) for c in loaded)
    np.testing.assert_array_equal(run(model, loaded, [5]), run(model, packed, [5]))
    keys, values = packed[0].keys_and_values()
    info = {"quant": quant, "bits": kb, "value_bits": vb, "group_size": packed[0].group_size}
    wrong = (*keys[:-1], keys[-1].astype(mx.float32))  # a float32 norm where float16 is stored
    with pytest.raises(
        ValueError, match=r"^layer 0: keys (residual )?norms is mlx.core.float32 of width 1, expected"
    ) as e:
        file_checks.check_rows(wrong, values, info, "layer 0")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "flags, message",
    [
        ("--quant turboquant --bits 5", "--bits/--key-bits 5: allowed are 1, 2, 3, 4 or 16 (unquantized)"),
        ("--quant turboquant_prod --bits 4 --value-bits 1", "--value-bits 1: allowed are 2, 3, 4 or 16"),
        ("--quant qjl --bits 4 --group-size 64", "group size 64 does not divide head_dim 32 of this model"),
    ],
)
def test_cli_refuses_a_width_or_group_the_scheme_cannot_take_in_one_line(
    model_dirs, prompt_file, capsys, flags, message
):
    args = [
        "compress",
        "--model",
        str(model_dirs["llama"]),
        "--prompt-file",
        str(prompt_file),
        *flags.split(),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
