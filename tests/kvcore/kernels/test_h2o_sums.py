"""Which capture chunks the h2o kernels take (16-bit, one dtype, head_dim they handle), and their host-side parts:
the merge of the lse splits and the block shapes."""

import mlx.core as mx
import numpy as np
import pytest

from kvcore.kernels import MAX_HEAD_DIM, h2o_sums


def test_fits_16_bit_chunks_of_one_dtype():
    q, keys = mx.zeros((8, 16, 64), mx.bfloat16), mx.zeros((2, 48, 64), mx.bfloat16)
    assert h2o_sums.fits(q, keys) and h2o_sums.fits(q.astype(mx.float16), keys.astype(mx.float16))
    assert not h2o_sums.applies(q, keys)  # a CPU: the MLX operations path runs
    assert not h2o_sums.fits(q.astype(mx.float32), keys.astype(mx.float32))
    assert not h2o_sums.fits(q, keys.astype(mx.float16))
    assert not h2o_sums.fits(mx.zeros((8, 16, 72), mx.bfloat16), mx.zeros((2, 48, 72), mx.bfloat16))
    assert not h2o_sums.fits(mx.zeros((6, 16, 64), mx.bfloat16), mx.zeros((4, 48, 64), mx.bfloat16))


def test_merged_splits_give_each_rows_log_sum_exp_over_all_its_keys():
    """The lse kernel's splits (running max and sum of 2^score per key range) merge into one base-2 log-sum-exp;
    a split a row sees no key of (max -inf, sum 0) adds nothing."""
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3, 5, 40)) * 6  # [H, N, keys] in base-2 units
    visible = (
        np.arange(40)[None, :] <= np.arange(12, 17)[:, None]
    )  # row i sees keys 0..12+i, as causal rows do
    scores = np.where(visible[None], scores, -np.inf)
    parts = np.split(scores, [16, 32], axis=-1)  # three splits; the last is empty for every row
    top = np.stack([p.max(axis=-1) for p in parts])
    total = np.stack(
        [
            np.where(np.isinf(m), 0.0, np.exp2(p - np.where(np.isinf(m), 0.0, m)[..., None]).sum(-1))
            for p, m in zip(parts, top, strict=True)
        ]
    )
    got = h2o_sums.merge_splits(mx.array(top, mx.float32), mx.array(total, mx.float32))
    want = np.log2(np.exp2(scores).sum(axis=-1))
    np.testing.assert_allclose(np.array(got), want, rtol=1e-6, atol=1e-5)
    one = h2o_sums.merge_splits(mx.array(top[:1], mx.float32), mx.array(total[:1], mx.float32))
    np.testing.assert_allclose(np.array(one), np.log2(np.exp2(parts[0]).sum(-1)), rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("head_dim", range(16, MAX_HEAD_DIM + 1, 16))
def test_every_head_dim_the_kernels_take_fits_their_static_shared_memory(head_dim):
    """Two tiles of TILE rows at head_dim + 8 16-bit columns stay under 48 KB (a kernel's static limit), and a
    step of 8-key score tiles never spans two shared-memory tiles."""
    q, keys = mx.zeros((8, 16, head_dim), mx.bfloat16), mx.zeros((2, 48, head_dim), mx.bfloat16)
    for tuning in (
        h2o_sums.DEFAULT_TUNING,
        h2o_sums.Tuning(warps=8, row_groups=1, lse_step=8, colsum_step=8),
    ):
        mt, tile, rows = tuning.shape(head_dim)
        assert 2 * tile * (head_dim + 8) * 2 <= 48 * 1024
        assert rows == tuning.warps * 16 * mt
        template = dict(h2o_sums._template(q, keys, tuning, tuning.lse_step))
        assert (tile // 8) % template["STEP"] == 0 and template["STEP"] <= tile // 8
