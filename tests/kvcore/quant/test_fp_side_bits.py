"""One side unquantized: float keys with packed values (K16/V4) and packed keys with float values (K4/V16),
stored as such, counted from the stored arrays and attended to as attention over the dequantized side."""

import csv

import numpy as np
import pytest

from kvcore import SparseQuantizedKVCache, quantize_cache
from kvcore.cache import files as cache_io
from kvcore.cli.main import main
from kvcore.engine.session import CompressionConfig, Session
from tests.kvcore.conftest import GROUP, prefill, prompt_ids, reference_attention, run

PROMPT = (
    "def area(width, height):\n    return width * height\nThe quick brown fox jumps over the lazy dog. " * 3
)
SPLITS = [(16, 4), (4, 16)]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("key_bits, value_bits", SPLITS)
def test_decode_equals_attention_over_the_float_side_and_the_dequantized_side(
    models, arch, key_bits, value_bits
):
    model, tok = models[arch]
    ids, group = prompt_ids(tok), GROUP[arch]
    split = quantize_cache(prefill(model, ids), bits=key_bits, group_size=group, value_bits=value_bits)
    first = prefill(model, ids)[0]
    dense_k, dense_v = (x[..., : first.offset, :] for x in (first.keys, first.values))
    k, v = split[0].keys_and_values()
    float_side, packed_side = (k, v) if key_bits == 16 else (v, k)
    assert len(float_side) == 1 and len(packed_side) == 3  # stored for real: a float array and packed parts
    assert np.array_equal(np.array(float_side[0]), np.array(dense_k if key_bits == 16 else dense_v))
    got = run(model, split, [5, 6, 7])
    dense = prefill(model, ids)
    with reference_attention(
        model, dense, [None] * len(dense), len(ids), quant=(key_bits, group, value_bits)
    ):
        want = run(model, dense, [5, 6, 7])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
    dense = prefill(model, ids)  # and not what packing both sides at the packed width gives
    both = min(key_bits, value_bits)
    with reference_attention(model, dense, [None] * len(dense), len(ids), quant=(both, group, both)):
        packed_both = run(model, dense, [5, 6, 7])
    assert np.abs(packed_both - want).max() > 1e-2


def _independent_bytes(layer, key_bits: int, value_bits: int, group: int, float_size: int) -> int:
    """Rows × heads × (each side: float row, or packed row + one scale and one bias per group)."""
    k = layer.keys_and_values()[0][0]
    rows, heads = layer.n_kept, k.shape[1]
    dim = k.shape[3] if key_bits == 16 else k.shape[3] * 32 // key_bits

    def side(bits: int) -> int:
        return dim * float_size if bits == 16 else dim * bits // 8 + 2 * (dim // group) * float_size

    return rows * heads * (side(key_bits) + side(value_bits))


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=8)
    return s


@pytest.mark.parametrize("key_bits, value_bits", SPLITS)
def test_session_bytes_equal_the_stored_arrays_and_the_float_side_has_no_error(session, key_bits, value_bits):
    group = GROUP["llama"]
    cfg = CompressionConfig.from_dict(
        {"method": "snapkv", "ratio": 0.5, "bits": key_bits, "value_bits": value_bits, "group_size": group}
    )
    assert cfg.widths == (key_bits, value_bits) and cfg.quantized
    state = session.compress(cfg)
    layers = [c for c in state.cache if isinstance(c, SparseQuantizedKVCache)]
    assert layers and all((c.bits, c.value_bits) == (key_bits, value_bits) for c in layers)
    float_size = session._observed("paper").cache[0].keys.dtype.size
    assert state.bytes_compressed == sum(
        _independent_bytes(c, key_bits, value_bits, group, float_size) for c in layers
    )
    rows = state.stats_rows
    assert {(r["key_bits"], r["value_bits"]) for r in rows} == {(key_bits, value_bits)}
    float_rmse, packed_rmse = ("key_rmse", "value_rmse") if key_bits == 16 else ("value_rmse", "key_rmse")
    assert all(r[float_rmse] == 0.0 and r[packed_rmse] > 0.0 for r in rows)
    full = session.compress(CompressionConfig("snapkv", 0.5))
    packed = session.compress(CompressionConfig("snapkv", 0.5, bits=4, group_size=group))
    assert packed.bytes_compressed < state.bytes_compressed < full.bytes_compressed
    regen = session.regenerate(state)
    assert regen.metrics["kl_mean"] >= 0.0 and len(regen.tokens) == 8


def test_a_float_side_cache_survives_save_and_load(session, tmp_path):
    state = session.compress(CompressionConfig("snapkv", 0.5, bits=None, value_bits=4, group_size=32))
    path = tmp_path / "c.safetensors"
    cache_io.save_cache(path, state.cache)
    loaded, _ = cache_io.load_cache(path)
    for a, b in zip(state.cache, loaded, strict=True):
        (ka, va), (kb, vb) = a.keys_and_values(), b.keys_and_values()
        assert (b.bits, b.value_bits) == (16, 4) and len(kb) == 1 and len(vb) == 3
        assert all(
            np.array_equal(np.array(x), np.array(y)) for x, y in zip((*ka, *va), (*kb, *vb), strict=True)
        )


def test_cli_key_bits_16_value_bits_4(model_dirs, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text(PROMPT)
    out = tmp_path / "s.csv"
    flags = f"--prompt-file {prompt} --group-size 32 --tokens 3 --key-bits 16 --value-bits 4 --csv {out}"
    assert main(["compress", "--model", str(model_dirs["llama"]), *flags.split()]) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["key_bits"], r["value_bits"], r["group_size"]) for r in rows} == {("16", "4", "32")}
    assert all(float(r["key_rmse"]) == 0.0 < float(r["value_rmse"]) for r in rows)
