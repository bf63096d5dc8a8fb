"""TurboQuant (Zandieh et al. 2025): the Gaussian Lloyd–Max codebooks, the paper's MSE distortion on random unit
vectors, TurboQuant-prod's unbiased inner products within the variance bound, pack/unpack against NumPy, and
one-line refusals."""

import math

import mlx.core as mx
import numpy as np
import pytest

from kvcore.quant import get
from kvcore.quant.bitpack import pack_bits, unpack_bits
from kvcore.quant.lloyd_max import gaussian_codebook
from kvcore.quant.projections import gaussian_sketch, random_rotation
from tests.kvcore.quant.inner_products import DIM, errors, mean_and_error, unit_rows

#: E‖x − x̂‖² of the b-bit Gaussian Lloyd–Max quantizer (unit variance): the values the paper's bound rests on.
PAPER_DISTORTION = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497}


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_codebooks_are_the_gaussian_lloyd_max_quantizers(bits):
    centroids, bounds, mse = gaussian_codebook(bits)
    assert len(centroids) == 2**bits and np.all(np.diff(centroids) > 0)
    np.testing.assert_allclose(centroids, -centroids[::-1], atol=1e-9)  # symmetric
    np.testing.assert_allclose(bounds, (centroids[1:] + centroids[:-1]) / 2)
    assert mse == pytest.approx(PAPER_DISTORTION[bits], rel=1e-3)
    if bits == 1:
        assert centroids[1] == pytest.approx(math.sqrt(2 / math.pi))  # E|X|


@pytest.fixture(scope="module")
def unit_vectors() -> mx.array:
    return mx.array(unit_rows(np.random.default_rng(0), 10_000).astype(np.float32))


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_mse_distortion_on_random_unit_vectors_is_the_papers(unit_vectors, bits):
    scheme = get("turboquant")
    x_hat = scheme.unpack(scheme.pack(unit_vectors, bits), bits)
    distortion = float(mx.mean(mx.sum((unit_vectors - x_hat) ** 2, axis=-1)))
    print(f"turboquant b={bits}: E|x - x^|^2 = {distortion:.5f} (paper {PAPER_DISTORTION[bits]})")
    assert distortion == pytest.approx(PAPER_DISTORTION[bits], rel=0.05)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_prod_inner_products_are_unbiased_within_the_variance_bound(bits):
    err, parts = errors("turboquant_prod", bits)
    mean, se = mean_and_error(err)
    assert abs(mean) < 3 * se, (mean, se)
    # Var ≤ π/(2d)·‖y‖²·‖r‖² per pair (QJL's bound on the 1-bit sketch of the residual r; ‖x‖ = ‖y‖ = 1)
    r_norm = np.concatenate([np.array(p[3], dtype=np.float64)[:, 0] for p in parts])
    bound = np.mean(math.pi / (2 * DIM) * r_norm**2)
    square, square_se = mean_and_error(err**2)
    assert square < bound + 3 * square_se, (square, bound)
    # and the bound is the paper's: π/(2d)·D_(b−1)
    assert bound == pytest.approx(math.pi / (2 * DIM) * PAPER_DISTORTION[bits - 1], rel=0.05)


def test_mse_alone_is_biased_for_inner_products():
    """What the prod stage is for: 1-bit MSE codes shrink inner products by about 2/π."""
    err, _ = errors("turboquant", 1)
    mean, se = mean_and_error(err)
    assert mean < -20 * se


def _numpy_turboquant(x: np.ndarray, bits: int, r: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed codes, norm, x̂) by the definition: codes = interval of (u·R)·√d, little-endian bit stream."""
    centroids, bounds, _ = gaussian_codebook(bits)
    d = x.shape[-1]
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    y = (x / norm) @ r * np.sqrt(d)
    codes = np.searchsorted(bounds, y)  # = number of boundaries below y
    stream = (codes[..., None] >> np.arange(bits)) & 1
    packed = np.packbits(
        stream.reshape(*codes.shape[:-1], d * bits).astype(np.uint8), axis=-1, bitorder="little"
    )
    x_hat = (centroids[codes] / np.sqrt(d)) @ r.T * norm
    return packed, norm, x_hat


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
@pytest.mark.parametrize("d", [64, 40])  # a Hadamard size, and one that takes a QR rotation
def test_pack_unpack_match_numpy(bits, d):
    x = np.random.default_rng(bits).normal(size=(2, 3, 5, d)).astype(np.float32) * 3
    scheme = get("turboquant", seed=4)
    r = np.array(random_rotation(d, 4), dtype=np.float64)
    np.testing.assert_allclose(r @ r.T, np.eye(d), atol=1e-5)
    codes, norm = scheme.pack(mx.array(x), bits)
    want_codes, want_norm, want = _numpy_turboquant(x.astype(np.float64), bits, r)
    assert codes.dtype == mx.uint8 and codes.shape == (2, 3, 5, d * bits // 8)
    mismatch = np.mean(np.array(codes) != want_codes)  # float32 vs float64 rotation: rare ties flip a code
    assert mismatch < 0.01
    np.testing.assert_allclose(np.array(norm, dtype=np.float64), want_norm, rtol=1e-3)
    x_hat = np.array(scheme.unpack((mx.array(want_codes), norm), bits))
    np.testing.assert_allclose(x_hat, want, rtol=2e-3, atol=2e-3)


def test_prod_unpack_matches_numpy():
    d, bits = 64, 3
    x = np.random.default_rng(9).normal(size=(4, d))
    scheme = get("turboquant_prod", seed=2)
    codes, signs, norm, r_norm = scheme.pack(mx.array(x.astype(np.float32)), bits)
    assert signs.shape == (4, d // 8) and codes.shape == (4, d * (bits - 1) // 8)
    r = np.array(random_rotation(d, 2), dtype=np.float64)
    s = np.array(gaussian_sketch(d, d, 2), dtype=np.float64)
    _, _, mse = _numpy_turboquant(x, bits - 1, r)
    unit_residual = (x - mse) / np.linalg.norm(x, axis=-1, keepdims=True)
    np.testing.assert_allclose(
        np.array(r_norm, dtype=np.float64)[:, 0], np.linalg.norm(unit_residual, axis=-1), rtol=3e-3
    )
    sign_bits = np.unpackbits(np.array(signs), axis=-1, bitorder="little")
    assert np.mean(sign_bits == (unit_residual @ s.T >= 0)) > 0.97
    pm = sign_bits * 2.0 - 1
    want = mse + np.linalg.norm(x, axis=-1, keepdims=True) * np.sqrt(np.pi / 2) / d * np.array(
        r_norm, dtype=np.float64
    ) * (pm @ s)
    np.testing.assert_allclose(np.array(scheme.unpack((codes, signs, norm, r_norm), bits)), want, atol=5e-3)


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5])
def test_bit_packing_matches_numpy_packbits(bits):
    codes = np.random.default_rng(bits).integers(0, 2**bits, size=(3, 7, 64)).astype(np.uint8)
    packed = np.array(pack_bits(mx.array(codes), bits))
    stream = ((codes[..., None] >> np.arange(bits)) & 1).reshape(3, 7, 64 * bits).astype(np.uint8)
    np.testing.assert_array_equal(packed, np.packbits(stream, axis=-1, bitorder="little"))
    np.testing.assert_array_equal(np.array(unpack_bits(mx.array(packed), bits)), codes)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: get("turboquant").check(5),
            r"bits=5 is not supported: turboquant allows bits in \(1, 2, 3, 4\)",
        ),
        (
            lambda: get("turboquant_prod").check(1),
            r"bits=1 is not supported: turboquant_prod allows bits in \(2, 3, 4\)",
        ),
        (lambda: get("turboquant").check(2, head_dim=36), r"head_dim=36 is not supported: .*multiple of 8"),
        (lambda: get("turboquant", seed=-1), r"seed must be an integer >= 0, got -1"),
        (
            lambda: get("turboquant", group_size=32),
            r"group_size=32 is not supported: turboquant allows group sizes \(1,\)",
        ),
        (
            lambda: get("turboquant", width=3),
            r"turboquant has no parameter width \(its parameters: group_size, seed\)",
        ),
    ],
)
def test_bad_input_is_refused_in_one_line(make, message):
    with pytest.raises(ValueError, match=message) as info:
        make()
    assert "\n" not in str(info.value)
