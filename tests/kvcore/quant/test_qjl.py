"""QJL (Zandieh et al. 2024): keys as signs of Gaussian projections and a norm, the paper's unbiased score
estimator within its variance bound, values packed as affine packs them, and one-line refusals."""

import math

import mlx.core as mx
import numpy as np
import pytest

from kvcore.quant import get
from kvcore.quant.projections import gaussian_sketch
from tests.kvcore.quant.inner_products import DIM, errors, mean_and_error


@pytest.mark.parametrize("bits", [2, 4])
def test_score_estimates_are_unbiased_within_the_variance_bound(bits):
    err, _ = errors("qjl", bits)
    mean, se = mean_and_error(err)
    assert abs(mean) < 3 * se, (mean, se)
    square, square_se = mean_and_error(err**2)
    m = bits * DIM
    assert square < math.pi / (2 * m) + 3 * square_se  # Var ≤ π/(2m)·‖q‖²‖k‖², unit pairs


def test_keys_pack_and_unpack_as_the_numpy_estimator():
    """q·k̂ is the paper's estimator √(π/2)/m·‖k‖·⟨S·q, sign(S·k)⟩ of q·k, S [m, d] regenerated from the seed."""
    rng = np.random.default_rng(3)
    d, bits = 32, 3
    k, q = rng.normal(size=(1, 2, 6, d)), rng.normal(size=(1, 2, 4, d))
    scheme = get("qjl", group_size=32, seed=7)
    signs, norm = scheme.pack(mx.array(k.astype(np.float32)), bits)
    m = bits * d
    assert signs.dtype == mx.uint8 and signs.shape == (1, 2, 6, m // 8) and norm.dtype == mx.float16
    s = np.array(gaussian_sketch(m, d, 7), dtype=np.float64)
    want_bits = (k @ s.T >= 0).astype(np.uint8)
    np.testing.assert_array_equal(np.array(signs), np.packbits(want_bits, axis=-1, bitorder="little"))
    k_norm = np.linalg.norm(k, axis=-1, keepdims=True)
    estimator = np.sqrt(np.pi / 2) / m * (q @ s.T) @ np.swapaxes((2.0 * want_bits - 1) * k_norm, -1, -2)
    k_hat = np.array(scheme.unpack((signs, norm), bits), dtype=np.float64)
    np.testing.assert_allclose(q @ np.swapaxes(k_hat, -1, -2), estimator, rtol=2e-3, atol=2e-3)


def test_values_are_packed_as_affine():
    v = mx.random.normal((1, 2, 5, 64), key=mx.random.key(1))
    qjl, affine = get("qjl", group_size=32), get("affine", group_size=32)
    got, want = qjl.pack_values(v, 4), affine.pack(v, 4)
    assert len(got) == 3 and all(mx.array_equal(a, b).item() for a, b in zip(got, want, strict=True))
    np.testing.assert_array_equal(np.array(qjl.unpack(got, 4)), np.array(affine.unpack(want, 4)))


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: get("qjl").check(7),
            r"bits=7 is not supported: qjl \(keys sketched, .*\) allows bits in \(2, 3",
        ),
        (
            lambda: get("qjl").check(4, head_dim=96),
            r"group_size=64 does not divide head_dim=96.*use one of \[32\]",
        ),
        (
            lambda: get("qjl", group_size=48),
            r"group_size=48 is not supported: qjl .* allows group sizes \(32, 64, 128\)",
        ),
        (lambda: get("qjl", seed=1.5), r"seed must be an integer, got 1.5"),
    ],
)
def test_bad_input_is_refused_in_one_line(make, message):
    with pytest.raises(ValueError, match=message) as info:
        make()
    assert "\n" not in str(info.value)
