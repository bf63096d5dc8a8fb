"""`kvcore.kernels.h2o_sums` as it was before its pipelined version (stop 33), kept as the GPU baseline.

Used only by `benchmarks.gpu_kernels` and `benchmarks.gpu_prefill_regen` (before vs now, side by side, in one run).
Two passes of `mma.sync` tiles, 8 warps of 16 rows a block, the other side's 64-row tiles loaded into shared memory
by plain loads between two barriers (no copy overlaps the multiplies), B fragments read as 32-bit words, the causal
mask tested on every score, one lse block per 128 queries over all the keys they see. On the H200: one chunk of 2048
queries over 32k keys 6.57 ms, 3.2× MLX's fused attention over it; prefill with capture at 32k 2.16× plain.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from kvcore.kernels import h2o_sums, scale_source

# isort: split
import mlx.core as mx

WARPS = (
    8  # per block, 16 query (lse) or key (colsum) rows each; the other side streams through in tiles of 64
)
ROWS = WARPS * 16
THREADS = WARPS * 32

_HEADER = (
    h2o_sums._FRAGMENTS
    + r"""
// Rows [row0, row0 + 64) of `base` into shared memory at a padded stride (conflict-free fragment reads); 0 past n_rows.
template <typename T, int D, int LD>
__device__ __forceinline__ void kvlens_tile(uint16_t* smem, const T* base, int row0, int n_rows) {
    for (int i = threadIdx.x; i < 64 * D / 8; i += blockDim.x) {
        const int r = i / (D / 8), c = (i % (D / 8)) * 8;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (row0 + r < n_rows) v = *reinterpret_cast<const uint4*>(base + (long)(row0 + r) * D + c);
        *reinterpret_cast<uint4*>(smem + r * LD + c) = v;
    }
}

// One 16x8 tile of scores: this warp's 16 A rows against the 8 shared rows starting at `col0`.
template <bool BF16, int D, int LD>
__device__ __forceinline__ void kvlens_scores(float* c, const uint32_t (*a)[4], const uint16_t* smem, int col0, int g, int t) {
    c[0] = c[1] = c[2] = c[3] = 0.f;
    for (int s = 0; s < D / 16; ++s) {
        const uint16_t* b = smem + (col0 + g) * LD + s * 16 + 2 * t;
        kvlens_mma<BF16>(c, a[s], *reinterpret_cast<const uint32_t*>(b), *reinterpret_cast<const uint32_t*>(b + 8));
    }
}
"""
)

_COMMON = r"""
    constexpr int LD = D + 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y;
    const int n_new = q_shape[1];
    const int n_keys = keys_shape[1];
    const int first = n_keys - n_new;  // chunk-local query i sits at position first + i
    const T* qh = q + (long)h * n_new * D;
    const T* kh = keys + (long)(h / GROUP) * n_keys * D;
    __shared__ __align__(16) uint16_t smem[64 * LD];
    uint32_t a[D / 16][4];
"""

_LSE = r"""
    const int q0 = blockIdx.x * ROWS + warp * 16;
    const int row_a = q0 + g, row_b = q0 + g + 8;
    kvlens_rows<T, D>(a, qh, q0, n_new, g, t);
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
    const int key_end = first + min((int)blockIdx.x * ROWS + ROWS, n_new);
    for (int k0 = 0; k0 < key_end; k0 += 64) {
        __syncthreads();
        kvlens_tile<T, D, LD>(smem, kh, k0, n_keys);
        __syncthreads();
        float s[8][4];
        float top_a = -INFINITY, top_b = -INFINITY;
        for (int nt = 0; nt < 8; ++nt) {
            kvlens_scores<BF16, D, LD>(s[nt], a, smem, nt * 8, g, t);
            for (int j = 0; j < 4; ++j) {
                const int key = k0 + nt * 8 + 2 * t + (j & 1);
                const int row = j < 2 ? row_a : row_b;
                s[nt][j] = key <= first + row ? s[nt][j] * SCALE_LOG2 : -INFINITY;
            }
            top_a = fmaxf(top_a, fmaxf(s[nt][0], s[nt][1]));
            top_b = fmaxf(top_b, fmaxf(s[nt][2], s[nt][3]));
        }
        for (int o = 1; o < 4; o <<= 1) {
            top_a = fmaxf(top_a, __shfl_xor_sync(0xffffffff, top_a, o));
            top_b = fmaxf(top_b, __shfl_xor_sync(0xffffffff, top_b, o));
        }
        const float new_a = fmaxf(m_a, top_a), new_b = fmaxf(m_b, top_b);
        l_a *= exp2f(m_a - new_a);
        l_b *= exp2f(m_b - new_b);
        for (int nt = 0; nt < 8; ++nt) {
            l_a += exp2f(s[nt][0] - new_a) + exp2f(s[nt][1] - new_a);
            l_b += exp2f(s[nt][2] - new_b) + exp2f(s[nt][3] - new_b);
        }
        m_a = new_a;
        m_b = new_b;
    }
    for (int o = 1; o < 4; o <<= 1) {
        l_a += __shfl_xor_sync(0xffffffff, l_a, o);
        l_b += __shfl_xor_sync(0xffffffff, l_b, o);
    }
    if (t == 0 && row_a < n_new) lse[(long)h * n_new + row_a] = m_a + log2f(l_a);
    if (t == 0 && row_b < n_new) lse[(long)h * n_new + row_b] = m_b + log2f(l_b);
"""

_COLSUM = r"""
    const int k0 = blockIdx.x * ROWS + warp * 16;
    const int key_a = k0 + g, key_b = k0 + g + 8;
    kvlens_rows<T, D>(a, kh, k0, n_keys, g, t);
    __shared__ float lse_tile[64];
    float acc_a = 0.f, acc_b = 0.f;
    const int i_start = max(0, (int)blockIdx.x * ROWS - first);  // the first query that sees this block's first key
    for (int i0 = (i_start / 64) * 64; i0 < n_new; i0 += 64) {
        __syncthreads();
        kvlens_tile<T, D, LD>(smem, qh, i0, n_new);
        if (threadIdx.x < 64)
            lse_tile[threadIdx.x] = i0 + threadIdx.x < n_new ? lse[(long)h * n_new + i0 + threadIdx.x] : INFINITY;
        __syncthreads();
        for (int nt = 0; nt < 8; ++nt) {
            float c[4];
            kvlens_scores<BF16, D, LD>(c, a, smem, nt * 8, g, t);
            for (int j = 0; j < 4; ++j) {
                const int col = nt * 8 + 2 * t + (j & 1);
                const int key = j < 2 ? key_a : key_b;
                const float p = key <= first + i0 + col ? exp2f(c[j] * SCALE_LOG2 - lse_tile[col]) : 0.f;
                if (j < 2) acc_a += p; else acc_b += p;
            }
        }
    }
    for (int o = 1; o < 4; o <<= 1) {
        acc_a += __shfl_xor_sync(0xffffffff, acc_a, o);
        acc_b += __shfl_xor_sync(0xffffffff, acc_b, o);
    }
    const int n_prev = prev_shape[1];
    if (t == 0 && key_a < n_keys)
        sums[(long)h * n_keys + key_a] = acc_a + (key_a < n_prev ? prev[(long)h * n_prev + key_a] : 0.f);
    if (t == 0 && key_b < n_keys)
        sums[(long)h * n_keys + key_b] = acc_b + (key_b < n_prev ? prev[(long)h * n_prev + key_b] : 0.f);
"""


@cache
def _kernels(scale: float) -> tuple[Any, Any]:
    """The two kernels for one attention scale (baked into the source: a model has one)."""
    tag, scale_line = scale_source(scale)
    head = scale_line + _COMMON
    lse = mx.fast.cuda_kernel(
        name=f"kvlens_h2o_lse_before_{tag}",
        input_names=["q", "keys"],
        output_names=["lse"],
        source=head + _LSE,
        header=_HEADER,
    )
    colsum = mx.fast.cuda_kernel(
        name=f"kvlens_h2o_colsum_before_{tag}",
        input_names=["q", "keys", "lse", "prev"],
        output_names=["sums"],
        source=head + _COLSUM,
        header=_HEADER,
    )
    return lse, colsum


def accumulate(sums: mx.array | None, q: mx.array, keys: mx.array, scale: float) -> mx.array:
    """`sums` [H_q, T_prev] (or None) plus this chunk's column sums, [H_q, T_k] float32.

    q: [H_q, N, D], the last N of the T_k positions whose keys [H_kv, T_k, D] are cached (the same contract as
    `kvcore.capture.prefill._accumulate_h2o`)."""
    n_q_heads, n_new, head_dim = q.shape
    n_kv_heads, n_keys, _ = keys.shape
    lse_kernel, colsum_kernel = _kernels(float(scale))
    template = [
        ("T", q.dtype),
        ("D", head_dim),
        ("GROUP", n_q_heads // n_kv_heads),
        ("BF16", q.dtype == mx.bfloat16),
        ("ROWS", ROWS),
    ]
    (lse,) = lse_kernel(
        inputs=[q, keys],
        template=template,
        grid=(THREADS * -(-n_new // ROWS), n_q_heads, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(n_q_heads, n_new)],
        output_dtypes=[mx.float32],
    )
    prev = sums if sums is not None else mx.zeros((n_q_heads, 1), mx.float32)
    (out,) = colsum_kernel(
        inputs=[q, keys, lse, prev],
        template=template,
        grid=(THREADS * -(-n_keys // ROWS), n_q_heads, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(n_q_heads, n_keys)],
        output_dtypes=[mx.float32],
    )
    return out


@contextmanager
def swapped() -> Iterator[None]:
    """`kvcore.capture.prefill` uses these kernels inside the block (it calls `h2o_sums.accumulate` by module attribute)."""
    now = h2o_sums.accumulate
    h2o_sums.accumulate = accumulate
    try:
        yield
    finally:
        h2o_sums.accumulate = now
