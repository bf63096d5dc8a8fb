"""Which capture chunks the h2o kernels take (16-bit, one dtype, head_dim they handle)."""

import mlx.core as mx

from kvcore.kernels import h2o_sums


def test_fits_16_bit_chunks_of_one_dtype():
    q, keys = mx.zeros((8, 16, 64), mx.bfloat16), mx.zeros((2, 48, 64), mx.bfloat16)
    assert h2o_sums.fits(q, keys) and h2o_sums.fits(q.astype(mx.float16), keys.astype(mx.float16))
    assert not h2o_sums.applies(q, keys)  # a CPU: the MLX operations path runs
    assert not h2o_sums.fits(q.astype(mx.float32), keys.astype(mx.float32))
    assert not h2o_sums.fits(q, keys.astype(mx.float16))
    assert not h2o_sums.fits(mx.zeros((8, 16, 72), mx.bfloat16), mx.zeros((2, 48, 72), mx.bfloat16))
    assert not h2o_sums.fits(mx.zeros((6, 16, 64), mx.bfloat16), mx.zeros((4, 48, 64), mx.bfloat16))
