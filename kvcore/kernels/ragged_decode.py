"""One-query attention over a ragged (AdaKV) sparse layer without a mask: a split-K CUDA kernel.

MLX 0.32's CUDA attention has no fused kernel for one query with an array mask, so a ragged layer's decode ran the
unfused fallback (scores, additive mask, softmax, weighted sum over the padded width: 0.72× B0 at 32k on the H200).
This reads each kv-head's real rows only — its first `prefix_counts[h]` selection rows, then every appended row
(`kvcore.cache.sparse` layout) — so neither padding nor a mask is read. Flash decoding: each block takes a span of one
kv-head's rows and keeps a running softmax (max, sum, weighted values) for every query head of the GQA group; a
second kernel merges the spans. float32 arithmetic, the model's dtype out. On the H200 (`benchmarks/gpu_kernels.py`):
0.43× the fallback's time for 32 layers at 32k, closer to a float64 reference (1.2e-4 against 2.7e-4).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import mlx.core as mx

from kvcore.kernels import MAX_HEAD_DIM, cuda_ready, scale_source

WARPS = 4  # warps per block of the first kernel
ROWS_PER_SPLIT = 128  # rows of one kv-head a block reads (the split count follows the layer's width)
SHARED_BYTES = 48 * 1024  # static shared memory a block may declare

_SPANS = r"""
    constexpr int E = D / 32;  // elements of a row per lane
    constexpr int U = 4;       // rows in flight per warp
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int split = blockIdx.x;
    const int n_splits = gridDim.x;
    const int h = blockIdx.y;
    const int n_rows = keys_shape[2];
    const int n_prefix = meta[H_KV];
    const int count = meta[h];
    const int n_h = count + (n_rows - n_prefix);
    const int per_split = (n_rows + n_splits - 1) / n_splits;
    const int row0 = split * per_split;
    const int row1 = min(row0 + per_split, n_h);
    const T* kh = keys + h * keys_strides[1];
    const T* vh = values + h * values_strides[1];
    const long k_row = keys_strides[2];
    const long v_row = values_strides[2];

    float qr[REP][E];
    for (int r = 0; r < REP; ++r)
        for (int e = 0; e < E; ++e)
            qr[r][e] = static_cast<float>(q[(h * REP + r) * D + lane * E + e]) * SCALE_LOG2;
    float m[REP], l[REP], acc[REP][E];
    for (int r = 0; r < REP; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.f;
        for (int e = 0; e < E; ++e) acc[r][e] = 0.f;
    }
    for (int base = row0 + warp * U; base < row1; base += WARPS * U) {
        float kx[U][E], vx[U][E];
        for (int u = 0; u < U; ++u) {
            const int t = base + u;
            if (t < row1) {
                const long j = t < count ? t : n_prefix + (t - count);
                const auto kv = *reinterpret_cast<const AlignedVector<T, E>*>(kh + j * k_row + lane * E);
                const auto vv = *reinterpret_cast<const AlignedVector<T, E>*>(vh + j * v_row + lane * E);
                for (int e = 0; e < E; ++e) {
                    kx[u][e] = static_cast<float>(kv[e]);
                    vx[u][e] = static_cast<float>(vv[e]);
                }
            } else {
                for (int e = 0; e < E; ++e) kx[u][e] = vx[u][e] = 0.f;
            }
        }
        for (int r = 0; r < REP; ++r) {
            float s[U];
            float top = -INFINITY;
            for (int u = 0; u < U; ++u) {
                float p = 0.f;
                for (int e = 0; e < E; ++e) p += qr[r][e] * kx[u][e];
                for (int o = 16; o > 0; o >>= 1) p += __shfl_xor_sync(0xffffffff, p, o);
                s[u] = base + u < row1 ? p : -INFINITY;
                top = fmaxf(top, s[u]);
            }
            const float m_new = fmaxf(m[r], top);
            const float corr = exp2f(m[r] - m_new);
            l[r] *= corr;
            for (int e = 0; e < E; ++e) acc[r][e] *= corr;
            for (int u = 0; u < U; ++u) {
                const float p = exp2f(s[u] - m_new);
                l[r] += p;
                for (int e = 0; e < E; ++e) acc[r][e] += p * vx[u][e];
            }
            m[r] = m_new;
        }
    }

    __shared__ float sm_m[WARPS][REP];
    __shared__ float sm_l[WARPS][REP];
    __shared__ float sm_acc[WARPS][REP][D];
    for (int r = 0; r < REP; ++r) {
        if (lane == 0) {
            sm_m[warp][r] = m[r];
            sm_l[warp][r] = l[r];
        }
        for (int e = 0; e < E; ++e) sm_acc[warp][r][lane * E + e] = acc[r][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < REP * D; i += WARPS * 32) {
        const int r = i / D, d = i % D;
        float top = -INFINITY;
        for (int w = 0; w < WARPS; ++w) top = fmaxf(top, sm_m[w][r]);
        float sum = 0.f, o = 0.f;
        if (top != -INFINITY) {
            for (int w = 0; w < WARPS; ++w) {
                const float c = exp2f(sm_m[w][r] - top);
                sum += sm_l[w][r] * c;
                o += sm_acc[w][r][d] * c;
            }
        }
        const long at = (long)(h * REP + r) * n_splits + split;
        part_acc[at * D + d] = o;
        if (d == 0) {
            part_ml[at * 2] = top;
            part_ml[at * 2 + 1] = sum;
        }
    }
"""

_MERGE = r"""
    const int hq = blockIdx.y;
    const int d = threadIdx.x;
    const int n_splits = part_ml_shape[1];
    const float* ml = part_ml + (long)hq * n_splits * 2;
    float top = -INFINITY;
    for (int s = 0; s < n_splits; ++s) top = fmaxf(top, ml[2 * s]);
    float sum = 0.f, o = 0.f;
    for (int s = 0; s < n_splits; ++s) {
        const float m = ml[2 * s];
        if (m == -INFINITY) continue;
        const float c = exp2f(m - top);
        sum += ml[2 * s + 1] * c;
        o += part_acc[((long)hq * n_splits + s) * D + d] * c;
    }
    out[hq * D + d] = static_cast<T>(o / sum);
"""


@cache
def _kernels(scale: float) -> tuple[Any, Any]:
    """The two kernels for one attention scale (baked into the source: a model has one)."""
    tag, scale_line = scale_source(scale)
    spans = mx.fast.cuda_kernel(
        name=f"kvlens_ragged_spans_{tag}",
        input_names=["q", "keys", "values", "meta"],
        output_names=["part_acc", "part_ml"],
        source=scale_line + _SPANS,
        ensure_row_contiguous=False,
    )
    merge = mx.fast.cuda_kernel(
        name="kvlens_ragged_merge",
        input_names=["part_acc", "part_ml"],
        output_names=["out"],
        source=_MERGE,
    )
    return spans, merge


def fits(queries: mx.array, keys: Any, cache: Any) -> bool:
    """Whether the kernel can take this decode step: one query of batch 1 over a ragged float layer of the
    queries' dtype, a head_dim it handles and a GQA group whose merge buffer fits in shared memory."""
    if queries.ndim != 4 or queries.shape[0] != 1 or queries.shape[2] != 1:
        return False
    if not isinstance(keys, mx.array) or keys.dtype != queries.dtype:
        return False
    if hasattr(cache, "bits") or not getattr(cache, "is_ragged", False):
        return False
    head_dim, n_kv_heads = queries.shape[3], cache.n_heads
    if head_dim % 32 or head_dim > MAX_HEAD_DIM or not n_kv_heads or queries.shape[1] % n_kv_heads:
        return False
    if WARPS * (queries.shape[1] // n_kv_heads) * head_dim * 4 > SHARED_BYTES:
        return False
    return queries.dtype in (mx.bfloat16, mx.float16, mx.float32)


def applies(queries: mx.array, keys: Any, cache: Any) -> bool:
    """`fits`, on CUDA with the kernels on: the check `kvcore.model.attention.sdpa` makes per ragged layer."""
    return cuda_ready() and fits(queries, keys, cache)


def attend(queries: mx.array, keys: mx.array, values: mx.array, meta: mx.array, scale: float) -> mx.array:
    """Attention of one query [1, H_q, 1, D] over `keys`/`values` [1, H_kv, n_rows, D] (a ragged layer's stored
    rows, padding included; views with a contiguous last axis), reading only the real rows `meta` names:
    int32 [H_kv + 1], each head's selection count, then the padded selection width."""
    _, n_q_heads, _, head_dim = queries.shape
    n_kv_heads, n_rows = keys.shape[1], keys.shape[2]
    n_splits = max(1, -(-n_rows // ROWS_PER_SPLIT))
    q = mx.contiguous(queries.reshape(n_q_heads, head_dim))
    spans, merge = _kernels(float(scale))
    part_acc, part_ml = spans(
        inputs=[q, keys, values, meta],
        template=[
            ("T", queries.dtype),
            ("D", head_dim),
            ("REP", n_q_heads // n_kv_heads),
            ("H_KV", n_kv_heads),
            ("WARPS", WARPS),
        ],
        grid=(WARPS * 32 * n_splits, n_kv_heads, 1),
        threadgroup=(WARPS * 32, 1, 1),
        output_shapes=[(n_q_heads, n_splits, head_dim), (n_q_heads, n_splits, 2)],
        output_dtypes=[mx.float32, mx.float32],
    )
    (out,) = merge(
        inputs=[part_acc, part_ml],
        template=[("T", queries.dtype), ("D", head_dim)],
        grid=(head_dim, n_q_heads, 1),
        threadgroup=(head_dim, 1, 1),
        output_shapes=[(1, n_q_heads, 1, head_dim)],
        output_dtypes=[queries.dtype],
    )
    return out
