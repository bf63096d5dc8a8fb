"""The rotated scheme (QuaRot/RotateKV): a seeded randomized Hadamard rotation checked against NumPy, packing that
equals rotate → affine → dequantize → unrotate, genuine attention equal to attention over those rows, less 4-bit
error than affine on keys with an outlier channel, bytes of codes + scales + biases, a head_dim refused in one line,
and `--quant rotated` through the CLI."""

import csv

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base as mlx_base

from kvcore import cache_tensor_bytes, quantize_cache
from kvcore.cache import files as cache_io
from kvcore.cache.residual import ResidualKVCache, split_select
from kvcore.cache.sparse import dequantized
from kvcore.cli.main import main
from kvcore.model.attention import split_quantized_sdpa
from kvcore.quant import get
from kvcore.quant.rotated import rotation_matrix
from tests.kvcore.conftest import PROMPT, _attention_replaced, prefill, prompt_ids, run


def sylvester(d: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


def reference_rotation(d: int, seed: int) -> np.ndarray:
    """R = diag(signs)·H/√d, rows rotated as x·R; signs ±1 from numpy's default_rng(seed)."""
    signs = np.random.default_rng(seed).choice(np.array([-1.0, 1.0]), size=d)
    return signs[:, None] * sylvester(d) / np.sqrt(d)


def reference_round_trip(x: np.ndarray, bits: int, group: int, seed: int) -> np.ndarray:
    """rotate (NumPy) → affine pack and unpack (mx.quantize) → unrotate (NumPy)."""
    r = reference_rotation(x.shape[-1], seed)
    packed = mx.quantize(mx.array((x @ r).astype(np.float32)), group_size=group, bits=bits)
    deq = np.array(mx.dequantize(*packed, group_size=group, bits=bits), dtype=np.float64)
    return deq @ r.T


@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("seed", [0, 7])
def test_rotation_is_the_numpy_randomized_hadamard_and_orthogonal(d, seed):
    r = np.array(rotation_matrix(d, seed), dtype=np.float64)
    np.testing.assert_allclose(r, reference_rotation(d, seed), atol=1e-6)
    np.testing.assert_allclose(r @ r.T, np.eye(d), atol=1e-5)
    assert not np.allclose(r, np.array(rotation_matrix(d, seed + 1)))  # the seed sets the signs


@pytest.mark.parametrize("d", [12, 80, 96, 112])
def test_non_power_of_two_rotations_are_orthogonal(d):
    r = np.array(rotation_matrix(d, 0), dtype=np.float64)
    np.testing.assert_allclose(r @ r.T, np.eye(d), atol=1e-5)
    x = mx.random.normal((3, d))
    scheme = get("rotated", group_size=32)
    np.testing.assert_allclose(np.array(scheme.unrotate(scheme.rotate(x))), np.array(x), atol=1e-5)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_equals_rotate_affine_unrotate(bits):
    x = np.random.default_rng(1).normal(size=(1, 2, 16, 64)).astype(np.float32)
    scheme = get("rotated", group_size=32, seed=3)
    parts = scheme.pack(mx.array(x), bits)
    assert len(parts) == 3 and parts[0].dtype == mx.uint32  # codes, scales, biases: affine's parts
    got = np.array(scheme.unpack(parts, bits))
    np.testing.assert_allclose(got, reference_round_trip(x, bits, 32, 3), atol=1e-5)


def test_genuine_attention_equals_attention_over_the_unrotated_dequantized_rows():
    rng = np.random.default_rng(2)
    q, k, v = (mx.array(rng.normal(size=(1, 4, n, 64)).astype(np.float32)) for n in (3, 40, 40))
    scheme = get("rotated", group_size=32, seed=5)
    kp, vp = scheme.pack(k[:, ::2], 4), scheme.pack(v[:, ::2], 3)  # GQA: 2 kv-heads for 4 query heads
    got = split_quantized_sdpa(q, kp, vp, 0.125, "causal", 32, 4, 3, "affine", scheme)
    kd, vd = scheme.unpack(kp, 4), scheme.unpack(vp, 3)
    want = mx.fast.scaled_dot_product_attention(q, kd, vd, scale=0.125, mask="causal")
    np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-4)
    unrotated = split_quantized_sdpa(q, kp, vp, 0.125, "causal", 32, 4, 3)  # no rotation: another answer
    assert np.abs(np.array(unrotated) - np.array(want)).max() > 1e-2


@pytest.mark.parametrize("kb, vb", [(4, 4), (8, 3), (16, 4), (4, 16)])
def test_model_decode_on_the_rotated_cache_equals_attention_over_its_dequantized_rows(models, kb, vb):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    packed = quantize_cache(prefill(model, ids), bits=kb, group_size=32, value_bits=vb, quant="rotated")
    assert all((c.quant, c.mode, c.bits, c.value_bits) == ("rotated", "affine", kb, vb) for c in packed)
    got = np.concatenate([run(model, packed, [5, 6, 7]), run(model, packed, [8])])  # several tokens, then one
    scheme = get("rotated", group_size=32)

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        k, v = (  # every row, as the cache packs them; a side of width 16 stays float
            x if b == 16 else scheme.unpack(scheme.pack(x, b), b) for x, b in ((keys, kb), (values, vb))
        )
        return mlx_base.scaled_dot_product_attention(queries, k, v, cache, scale, mask, sinks)

    dense = prefill(model, ids)
    with _attention_replaced(model, sdpa):
        want = np.concatenate([run(model, dense, [5, 6, 7]), run(model, dense, [8])])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)


def test_files_keep_the_scheme_and_the_rotation(models, tmp_path):
    model, tok = models["llama"]
    packed = quantize_cache(prefill(model, prompt_ids(tok)), bits=4, group_size=32, quant="rotated")
    path = tmp_path / "cache.safetensors"
    cache_io.save_cache(path, packed)
    loaded, _ = cache_io.load_cache(path)
    assert all(c.quant == "rotated" for c in loaded)
    np.testing.assert_array_equal(run(model, loaded, [5]), run(model, packed, [5]))


def test_decode_with_a_float_residual_equals_attention_over_dequantized_body_and_float_rows(models):
    model, tok = models["llama"]
    ids = prompt_ids(tok)
    T, n_sink, recent = len(ids), 2, 3
    packed = quantize_cache(prefill(model, ids), bits=4, group_size=32, quant="rotated")
    cache = split_select(prefill(model, ids), packed, [np.arange(T)] * len(packed), T, n_sink, recent)
    assert all(isinstance(c, ResidualKVCache) and c.quant == "rotated" for c in cache)
    got = np.concatenate([run(model, cache, [5, 6, 7]), run(model, cache, [8])])
    scheme = get("rotated", group_size=32)

    def sdpa(queries, keys, values, cache, scale, mask, sinks=None):
        rows = np.arange(keys.shape[2])
        exact = mx.array(((rows < n_sink) | (rows >= T - recent))[:, None])  # the residual and new tokens
        k, v = (mx.where(exact, x, scheme.unpack(scheme.pack(x, 4), 4)) for x in (keys, values))
        return mlx_base.scaled_dot_product_attention(queries, k, v, cache, scale, mask, sinks)

    dense = prefill(model, ids)
    with _attention_replaced(model, sdpa):
        want = np.concatenate([run(model, dense, [5, 6, 7]), run(model, dense, [8])])
    np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)


def test_stored_bytes_are_codes_scales_and_biases(models):
    model, tok = models["llama"]
    dense = prefill(model, prompt_ids(tok))
    packed = quantize_cache(dense, bits=4, group_size=32, quant="rotated")
    _, heads, rows, dim = dense[0].keys[..., : dense[0].offset, :].shape
    scale = dense[0].keys.dtype.size
    per_side = dim * 4 // 8 + (dim // 32) * scale * 2
    assert cache_tensor_bytes(packed) == len(dense) * heads * rows * 2 * per_side
    affine = quantize_cache(prefill(model, prompt_ids(tok)), bits=4, group_size=32)
    assert cache_tensor_bytes(packed) == cache_tensor_bytes(affine)  # the rotation stores nothing


def test_outlier_channel_error_is_lower_rotated_than_affine():
    rng = np.random.default_rng(4)
    keys = rng.normal(size=(1, 4, 256, 128)).astype(np.float32)
    keys[..., 17] *= 30.0  # one outlier channel, as keys have
    x = mx.array(keys)

    def rmse(quant: str) -> float:
        parts = get(quant, group_size=64).pack(x, 4)
        return float(np.sqrt(np.mean((np.array(dequantized(parts, 64, 4, quant)) - keys) ** 2)))

    rotated, affine = rmse("rotated"), rmse("affine")
    assert rotated < 0.5 * affine, (rotated, affine)


@pytest.mark.parametrize("d", [50, 100, 72])
def test_head_dim_the_hadamard_transform_cannot_take_is_refused_in_one_line(d):
    scheme = get("rotated", group_size=32)
    with pytest.raises(ValueError) as err:
        scheme.check(4, d)
    message = str(err.value)
    assert "\n" not in message and f"head_dim={d}" in message and "12·2^k" in message
    with pytest.raises(ValueError, match="2\\^k"):
        scheme.pack(mx.zeros((1, 1, 2, d)), 4)


def test_cli_compress_quant_rotated(model_dirs, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text(PROMPT)
    out = tmp_path / "s.csv"
    flags = f"--prompt-file {prompt} --quant rotated --bits 4 --group-size 32 --tokens 3 --csv {out}"
    assert main(["compress", "--model", str(model_dirs["llama"]), *flags.split()]) == 0
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and {(r["quant_scheme"], r["execution"], r["key_bits"]) for r in rows} == {
        ("rotated", "genuine", "4")
    }
    assert all(float(r["key_rmse"]) > 0.0 for r in rows)
