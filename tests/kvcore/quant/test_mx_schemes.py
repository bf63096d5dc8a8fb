"""MLX's microscaling schemes (mxfp4, nvfp4, mxfp8) in the sparse caches: attention runs on the packed form and
equals attention over the dequantized rows; the bytes are codes plus one-byte scales; files and states keep the
scheme, and older states load as affine."""

import mlx.core as mx
import numpy as np
import pytest

from kvcore import SparseQuantizedKVCache, cache_tensor_bytes, quantize_cache
from kvcore.cache import files as cache_io
from kvcore.engine.session import CompressionConfig, Session
from kvcore.quant import get
from tests.kvcore.conftest import GROUP, prefill, prompt_ids, reference_attention, run

SCHEMES = [("mxfp4", 4), ("nvfp4", 4), ("mxfp8", 8)]


@pytest.mark.parametrize("quant, bits", SCHEMES)
def test_genuine_decode_equals_attention_over_the_dequantized_rows(models, quant, bits):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    packed = quantize_cache(prefill(model, ids), bits=bits, quant=quant)
    assert all((c.quant, c.mode, c.bits) == (quant, quant, bits) for c in packed)
    got = run(model, packed, [5, 6, 7])
    group = get(quant).group_size
    dense = prefill(model, ids)
    with reference_attention(model, dense, [None] * len(dense), len(ids), quant=(bits, group), mode=quant):
        want = run(model, dense, [5, 6, 7])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
    if bits == 4:  # and it is the scheme's own rounding: affine at the same width lands elsewhere
        dense = prefill(model, ids)
        with reference_attention(model, dense, [None] * len(dense), len(ids), quant=(4, GROUP["llama"])):
            affine = run(model, dense, [5, 6, 7])
        assert np.abs(affine - want).max() > 2e-3


def _formula_bytes(
    n_layers: int, heads: int, rows: int, dim: int, bits: int, group: int, scale_bytes: int, biases: bool
) -> int:
    """Rows × heads × both sides × (codes + a scale (and a bias) per group), from the widths alone."""
    per_side = dim * bits // 8 + (dim // group) * scale_bytes * (2 if biases else 1)
    return n_layers * heads * rows * 2 * per_side


@pytest.mark.parametrize("quant, bits", [*SCHEMES, ("affine", 4)])
def test_stored_bytes_equal_codes_plus_scales(models, quant, bits):
    model, tok = models["llama"]
    dense = prefill(model, prompt_ids(tok))
    packed = quantize_cache(dense, bits=bits, group_size=GROUP["llama"], quant=quant)
    _, heads, rows, dim = dense[0].keys[..., : dense[0].offset, :].shape
    scheme = packed[0].scheme
    scale_bytes = (
        dense[0].keys.dtype.size if quant == "affine" else 1
    )  # affine: the rows' float; MX: one byte
    want = _formula_bytes(
        len(dense), heads, rows, dim, bits, scheme.group_size, scale_bytes, quant == "affine"
    )
    assert cache_tensor_bytes(packed) == want


@pytest.mark.parametrize("quant, bits", SCHEMES)
def test_files_and_states_keep_the_scheme(models, tmp_path, quant, bits):
    model, tok = models["llama"]
    packed = quantize_cache(prefill(model, prompt_ids(tok)), bits=bits, quant=quant)
    path = tmp_path / "cache.safetensors"
    cache_io.save_cache(path, packed)
    loaded, _ = cache_io.load_cache(path)
    assert [(c.quant, c.group_size, c.bits) for c in loaded] == [
        (c.quant, c.group_size, c.bits) for c in packed
    ]
    for a, b in zip(loaded, packed, strict=True):
        for x, y in zip(a.keys_and_values()[0], b.keys_and_values()[0], strict=True):
            assert mx.array_equal(x, y)
    np.testing.assert_array_equal(run(model, loaded, [5]), run(model, packed, [5]))
    copy = SparseQuantizedKVCache()
    copy.state = packed[0].state
    assert copy.quant == quant


def test_an_older_state_without_the_scheme_loads_as_affine(models):
    model, tok = models["llama"]
    (layer, *_) = quantize_cache(prefill(model, prompt_ids(tok)), bits=4, group_size=GROUP["llama"])
    old = SparseQuantizedKVCache()
    old.state = layer.state[:-1]  # before schemes: ... group_size, bits, value_bits
    assert (old.quant, old.mode, old.bits) == ("affine", "affine", 4)
    older = SparseQuantizedKVCache()
    older.state = layer.state[:-2]  # before split widths: ... group_size, bits
    assert (older.quant, older.value_bits) == ("affine", 4)


def test_a_session_compresses_with_a_scheme_and_its_stats_say_so(model_dirs):
    session = Session.load(str(model_dirs["llama"]))
    session.prefill(
        "def main(argv):\n    return sum(x * x for x in argv)\nThe quick brown fox jumps over the lazy dog. "
        * 3,
        n_tokens=8,
    )
    state = session.compress(CompressionConfig("snapkv", 0.5, bits=4, quant="nvfp4"))
    layers = [c for c in state.cache if isinstance(c, SparseQuantizedKVCache)]
    assert layers and all(c.quant == "nvfp4" and c.group_size == 16 for c in layers)
    assert {(r["quant_scheme"], r["execution"], r["group_size"]) for r in state.stats_rows} == {
        ("nvfp4", "genuine", 16)
    }
    assert np.nanmax(state.quant_error) > 0  # the error view unpacks with the scheme
    regen = session.regenerate(state)
    assert len(regen.tokens) == 8 and np.isfinite(regen.metrics["kl_mean"])


@pytest.mark.parametrize("quant, bits", SCHEMES)
def test_the_float_residual_composes_with_every_scheme(models, quant, bits):
    """The residual is an option of every scheme: a packed body in the scheme's mode beside float rows."""
    from kvcore.cache.residual import ResidualKVCache, split_select

    model, tok = models["llama"]
    ids = prompt_ids(tok)
    T, n_sink, recent = len(ids), 2, 4
    fp = prefill(model, ids)
    kept = [np.arange(0, T, 2 if layer % 2 else 1) for layer in range(len(fp))]
    packed = quantize_cache(prefill(model, ids), bits=bits, quant=quant)
    cache = split_select(fp, packed, kept, T, n_sink, recent)
    assert all(isinstance(c, ResidualKVCache) and c.quant == quant for c in cache)
    got = run(model, cache, [5, 6, 7])
    dense = prefill(model, ids)
    residual = np.r_[0:n_sink, T - recent : T]
    heads = fp[0].keys.shape[1]
    per_head = [[k] * heads for k in kept]
    group = get(quant).group_size
    with reference_attention(
        model, dense, per_head, T, quant=(bits, group), float_positions=residual, mode=quant
    ):
        want = run(model, dense, [5, 6, 7])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
