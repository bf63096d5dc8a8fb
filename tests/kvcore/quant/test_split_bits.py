"""Split K/V bits: keys and values packed at their own widths, stored, counted and attended to as such."""

import mlx.core as mx
import numpy as np
import pytest

from kvcore import SparseQuantizedKVCache, quantize_cache
from kvcore.cache import files as cache_io
from kvcore.engine.session import CompressionConfig, Session
from tests.kvcore.conftest import GROUP, prefill, prompt_ids, reference_attention, run

PROMPT = (
    "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog. " * 3
)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_k8v4_decode_equals_attention_over_dequantized_keys_8bit_values_4bit(models, arch):
    model, tok = models[arch]
    ids = prompt_ids(tok)
    group = GROUP[arch]
    split = quantize_cache(prefill(model, ids), bits=8, group_size=group, value_bits=4)
    assert all((c.bits, c.value_bits) == (8, 4) for c in split)
    got = run(model, split, [5, 6, 7])
    dense = prefill(model, ids)
    with reference_attention(model, dense, [None] * len(dense), len(ids), quant=(8, group, 4)):
        want = run(model, dense, [5, 6, 7])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
    # and it is not what one width would give: 4/4 differs from the 8/4 reference by more than the tolerance
    dense = prefill(model, ids)
    with reference_attention(model, dense, [None] * len(dense), len(ids), quant=(4, group, 4)):
        same_width = run(model, dense, [5, 6, 7])
    assert np.abs(same_width - want).max() > 1e-2


def _independent_bytes(layer, key_bits: int, value_bits: int, group: int) -> int:
    """Rows × heads × (packed K + packed V + one scale and one bias per group of each), from the widths alone."""
    packed = layer.keys[0]
    rows, heads, dim = layer.n_kept, packed.shape[1], packed.shape[3] * 32 // key_bits
    scale_bytes = layer.keys[1].dtype.size
    per_row = dim * key_bits // 8 + dim * value_bits // 8 + 2 * 2 * (dim // group) * scale_bytes
    return rows * heads * per_row


@pytest.fixture(scope="module")
def session(model_dirs):
    s = Session.load(str(model_dirs["llama"]))
    s.prefill(PROMPT, n_tokens=12)
    return s


@pytest.mark.parametrize("ratio, per_head", [(0.5, False), (0.25, True)])
def test_k8v4_bytes_equal_an_independent_count(session, ratio, per_head):
    group = GROUP["llama"]
    state = session.compress(
        CompressionConfig("snapkv", ratio, bits=8, value_bits=4, group_size=group, per_head=per_head)
    )
    layers = [c for c in state.cache if isinstance(c, SparseQuantizedKVCache)]
    assert layers and all((c.bits, c.value_bits) == (8, 4) for c in layers)
    assert state.bytes_compressed == sum(_independent_bytes(c, 8, 4, group) for c in layers)
    same = session.compress(CompressionConfig("snapkv", ratio, bits=8, group_size=group, per_head=per_head))
    assert state.bytes_compressed < same.bytes_compressed
    rows = state.stats_rows
    assert {(r["key_bits"], r["value_bits"]) for r in rows} == {(8, 4)}


def test_k8v4_sits_between_k8v8_and_k4v4_in_kl(session):
    group = GROUP["llama"]
    kl = {}
    for kb, vb in ((8, 8), (8, 4), (4, 4)):
        cfg = CompressionConfig("full", 1.0, bits=kb, value_bits=vb, group_size=group)
        kl[(kb, vb)] = session.regenerate(session.compress(cfg)).metrics["kl_mean"]
    assert kl[(8, 8)] < kl[(8, 4)] < kl[(4, 4)], kl


def test_value_bits_roundtrip_through_dict_file_and_value_error(session, tmp_path):
    cfg = CompressionConfig("snapkv", 0.5, bits=8, value_bits=4, group_size=32)
    assert CompressionConfig.from_dict(cfg.to_dict()) == cfg
    assert CompressionConfig.from_dict({**cfg.to_dict(), "value_bits": 8}).value_bits is None
    state = session.compress(cfg)
    path = tmp_path / "c.safetensors"
    cache_io.save_cache(path, state.cache)
    loaded, _ = cache_io.load_cache(path)
    q = [c for c in loaded if isinstance(c, SparseQuantizedKVCache)]
    assert q and all((c.bits, c.value_bits) == (8, 4) for c in q)
    assert CompressionConfig.from_dict({**cfg.to_dict(), "bits": 16, "value_bits": 16}).quantized is False
    with pytest.raises(ValueError, match="value bits"):
        CompressionConfig("snapkv", 0.5, bits=8, value_bits=7)


def test_split_cache_state_restores_both_widths(models):
    model, tok = models["llama"]
    (layer, *_) = quantize_cache(prefill(model, prompt_ids(tok)), bits=8, group_size=32, value_bits=4)
    copy = SparseQuantizedKVCache.__new__(SparseQuantizedKVCache)
    copy.state = layer.state
    assert (copy.bits, copy.value_bits, copy.group_size) == (8, 4, 32)
    k, v = copy.keys_and_values()
    assert mx.array_equal(k[0], layer.keys_and_values()[0][0]) and v[0].shape[-1] == k[0].shape[-1] // 2
