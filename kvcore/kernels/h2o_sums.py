"""h2o's column sums of the causal softmax attention, chunk by chunk, without materialising a score: CUDA kernels.

The MLX-operations path (`kvcore.capture.prefill._accumulate_h2o`) writes every query's softmax row over every earlier key,
several float32 passes each: 12.8× a plain prefill at 32k on the H200, and the reason "auto" kept the queries
(lazy) instead, at 2× the dense cache in memory. These two kernels compute the same sums from the chunk's queries
and the cached keys with tensor-core tiles (`mma.sync` m16n8k16, bf16/fp16 in, float32 accumulate), holding only
[H_q, N] log-sum-exps between them:

1. `lse`: per query row, the running max and sum of its scaled scores over one split of the keys it sees (online,
   a few 8-key tiles a step); the splits (`Tuning.keys_per_split`) keep every multiprocessor busy on long contexts
   and are merged into one log-sum-exp per row by a few MLX operations;
2. `colsum`: per key, the sum over the queries that see it of exp(score − lse), added to the previous chunks'
   sums.

Both keep their 16·MT rows per warp in registers as mma A fragments and stream the other side through shared memory
in tiles, two buffers deep (`cp.async`: the next tile is copied while this one is multiplied), read by `ldmatrix`;
each B fragment serves MT row groups. The causal mask is applied only on tiles that cross the diagonal.

Scores are scale · q·k in float32 (bf16 products are exact in float32), in base 2 (exp2) with log2(e) folded into
the scale. Another summation order and exp than the MLX path: `benchmarks/gpu_kernels.py` checks them against it on
a GPU (relative error, each query's probabilities summing to 1, the 25 % kept per kv-head), and times them against
the kernels before (`benchmarks/h2o_sums_before.py`) and MLX's fused attention over the same chunk. On an H100 a
chunk of 2048 queries over 32k keys takes 4.0 ms (before: 6.7 ms; the fused attention 2.0 ms), and prefill with
capture at 32k 1.75× a plain prefill (before: 2.23×).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import mlx.core as mx

from kvcore.kernels import MAX_HEAD_DIM, cuda_ready, scale_source

_LN2 = 0.6931471805599453

# The mma and A-fragment helpers, shared with benchmarks/h2o_sums_before.py.
_FRAGMENTS = r"""
template <bool BF16>
__device__ __forceinline__ void kvlens_mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    if constexpr (BF16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}
// Two consecutive 16-bit elements of row `row` (0 past `n_rows`) as one 32-bit word: an mma fragment register.
template <typename T, int D>
__device__ __forceinline__ uint32_t kvlens_pair(const T* base, int row, int n_rows, int col) {
    return row < n_rows ? *reinterpret_cast<const uint32_t*>(base + (long)row * D + col) : 0u;
}

// The A fragments of 16 rows starting at `row0` (this thread's rows row0 + g and row0 + g + 8), all of head_dim.
template <typename T, int D>
__device__ __forceinline__ void kvlens_rows(uint32_t (*a)[4], const T* base, int row0, int n_rows, int g, int t) {
#pragma unroll
    for (int s = 0; s < D / 16; ++s) {
        a[s][0] = kvlens_pair<T, D>(base, row0 + g, n_rows, s * 16 + 2 * t);
        a[s][1] = kvlens_pair<T, D>(base, row0 + g + 8, n_rows, s * 16 + 2 * t);
        a[s][2] = kvlens_pair<T, D>(base, row0 + g, n_rows, s * 16 + 8 + 2 * t);
        a[s][3] = kvlens_pair<T, D>(base, row0 + g + 8, n_rows, s * 16 + 8 + 2 * t);
    }
}
"""

_HEADER = (
    _FRAGMENTS
    + r"""
__device__ __forceinline__ float kvlens_exp2(float x) {  // 2^x on the special-function unit; 2^-inf = 0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t kvlens_shared(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Rows [row0, row0 + TILE) of `base` into shared memory at a padded stride, copied asynchronously (cp.async, 16
// bytes a thread and step; rows past n_rows are zero-filled), committed as one group.
template <typename T, int D, int LD, int TILE, int THREADS>
__device__ __forceinline__ void kvlens_tile_async(uint16_t* smem, const T* base, int row0, int n_rows) {
#pragma unroll
    for (int i = threadIdx.x; i < TILE * D / 8; i += THREADS) {
        const int r = i / (D / 8), c = (i % (D / 8)) * 8;
        const bool ok = row0 + r < n_rows;
        const T* src = base + (long)(ok ? row0 + r : 0) * D + c;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(kvlens_shared(smem + r * LD + c)), "l"(src), "r"(ok ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

// Start copying tile it + 1 (rows from `next_row`) into the other buffer, then wait for tile it and the block.
template <typename T, int D, int LD, int TILE, int THREADS>
__device__ __forceinline__ void kvlens_next_tile(uint16_t (*smem)[TILE * LD], const T* base, int it, int n_tiles,
                                                 int next_row, int n_rows) {
    if (it + 1 < n_tiles) {
        kvlens_tile_async<T, D, LD, TILE, THREADS>(smem[(it + 1) & 1], base, next_row, n_rows);
        asm volatile("cp.async.wait_group 1;\n" ::);
    } else {
        asm volatile("cp.async.wait_group 0;\n" ::);
    }
    __syncthreads();
}

// One 16x8 score tile per row group of this warp: its MT x 16 A rows against the 8 shared rows at `col0`; the B
// fragments come from shared memory by ldmatrix, each used by all MT row groups.
template <bool BF16, int D, int LD, int MT>
__device__ __forceinline__ void kvlens_scores(float (*c)[4], const uint32_t (*a)[D / 16][4], const uint16_t* smem,
                                              int col0, int lane) {
#pragma unroll
    for (int m = 0; m < MT; ++m) c[m][0] = c[m][1] = c[m][2] = c[m][3] = 0.f;
    const uint16_t* row = smem + (col0 + (lane & 7)) * LD + (lane >> 3) * 8;
#pragma unroll
    for (int s = 0; s + 1 < D / 16; s += 2) {
        uint32_t b[4];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(kvlens_shared(row + s * 16)));
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            kvlens_mma<BF16>(c[m], a[m][s], b[0], b[1]);
            kvlens_mma<BF16>(c[m], a[m][s + 1], b[2], b[3]);
        }
    }
    if constexpr ((D / 16) % 2 == 1) {
        constexpr int s = D / 16 - 1;
        uint32_t b[2];
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(b[0]), "=r"(b[1]) : "r"(kvlens_shared(row + s * 16 - ((lane >> 3) & 2) * 8)));
#pragma unroll
        for (int m = 0; m < MT; ++m) kvlens_mma<BF16>(c[m], a[m][s], b[0], b[1]);
    }
}
"""
)

_COMMON = r"""
    constexpr int LD = D + 8;
    constexpr int THREADS = WARPS * 32;
    constexpr int ROWS = WARPS * 16 * MT;
    constexpr int NT = TILE / 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y;
    const int n_new = q_shape[1];
    const int n_keys = keys_shape[1];
    const int first = n_keys - n_new;  // chunk-local query i sits at position first + i
    const T* qh = q + (long)h * n_new * D;
    const T* kh = keys + (long)(h / GROUP) * n_keys * D;
    __shared__ __align__(16) uint16_t smem[2][TILE * LD];
    uint32_t a[MT][D / 16][4];
"""

_LSE = r"""
    const int q_block = blockIdx.x * ROWS;
    const int q0 = q_block + warp * 16 * MT;
#pragma unroll
    for (int m = 0; m < MT; ++m) kvlens_rows<T, D>(a[m], qh, q0 + m * 16, n_new, g, t);
    float mx_[MT][2], l_[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m) mx_[m][0] = mx_[m][1] = -INFINITY, l_[m][0] = l_[m][1] = 0.f;
    const int key_begin = blockIdx.z * SPLIT;
    const int key_end = min(first + min(q_block + ROWS, n_new), key_begin + SPLIT);
    const int n_tiles = key_end > key_begin ? (key_end - key_begin + TILE - 1) / TILE : 0;
    if (n_tiles > 0) kvlens_tile_async<T, D, LD, TILE, THREADS>(smem[0], kh, key_begin, n_keys);
    for (int it = 0; it < n_tiles; ++it) {
        const int k0 = key_begin + it * TILE;
        kvlens_next_tile<T, D, LD, TILE, THREADS>(smem, kh, it, n_tiles, k0 + TILE, n_keys);
        const bool full = k0 + TILE - 1 <= first + q_block;  // every row of the block sees every key of the tile
#pragma unroll
        for (int n4 = 0; n4 < NT; n4 += STEP) {  // 8·STEP keys per online step
            float s[STEP][MT][4];
#pragma unroll
            for (int u = 0; u < STEP; ++u) kvlens_scores<BF16, D, LD, MT>(s[u], a, smem[it & 1], (n4 + u) * 8, lane);
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                float top[2] = {-INFINITY, -INFINITY};
#pragma unroll
                for (int u = 0; u < STEP; ++u)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        float v = s[u][m][j];  // unscaled: the max commutes with the positive scale
                        if (!full) {
                            const int key = k0 + (n4 + u) * 8 + 2 * t + (j & 1);
                            const int row = q0 + m * 16 + g + (j >> 1) * 8;
                            if (key > first + row) v = -INFINITY;
                        }
                        s[u][m][j] = v;
                        top[j >> 1] = fmaxf(top[j >> 1], v);
                    }
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffff, top[r], 1));
                    top[r] = fmaxf(top[r], __shfl_xor_sync(0xffffffff, top[r], 2));
                    const float next = fmaxf(mx_[m][r], top[r] * SCALE_LOG2);
                    const float base = next == -INFINITY ? 0.f : next;  // a row that sees no key yet stays at 0
                    float sum = l_[m][r] * kvlens_exp2(mx_[m][r] - base);
#pragma unroll
                    for (int u = 0; u < STEP; ++u)
                        sum += kvlens_exp2(fmaf(s[u][m][2 * r], SCALE_LOG2, -base)) +
                               kvlens_exp2(fmaf(s[u][m][2 * r + 1], SCALE_LOG2, -base));
                    l_[m][r] = sum;
                    mx_[m][r] = next;
                }
            }
        }
        __syncthreads();
    }
    const long out0 = ((long)blockIdx.z * gridDim.y + h) * n_new;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = l_[m][r];
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
            const int row = q0 + m * 16 + g + r * 8;
            if (t == 0 && row < n_new) {
                part_max[out0 + row] = mx_[m][r];
                part_sum[out0 + row] = sum;
            }
        }
"""

_COLSUM = r"""
    const int k_block = blockIdx.x * ROWS;
    const int k0 = k_block + warp * 16 * MT;
#pragma unroll
    for (int m = 0; m < MT; ++m) kvlens_rows<T, D>(a[m], kh, k0 + m * 16, n_keys, g, t);
    float acc[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = 0.f;
    const float* lse_h = lse + (long)h * n_new;
    const int i_first = (max(0, k_block - first) / TILE) * TILE;  // the tile of the first query that sees the block
    const int n_tiles = n_new > i_first ? (n_new - i_first + TILE - 1) / TILE : 0;
    if (n_tiles > 0) kvlens_tile_async<T, D, LD, TILE, THREADS>(smem[0], qh, i_first, n_new);
    for (int it = 0; it < n_tiles; ++it) {
        const int i0 = i_first + it * TILE;
        kvlens_next_tile<T, D, LD, TILE, THREADS>(smem, qh, it, n_tiles, i0 + TILE, n_new);
        const bool full = k_block + ROWS - 1 <= first + i0;  // every key of the block is seen by every query of the tile
#pragma unroll
        for (int n0 = 0; n0 < NT; n0 += STEP) {  // STEP score tiles multiplied before their exps
            float c[STEP][MT][4];
#pragma unroll
            for (int u = 0; u < STEP; ++u) kvlens_scores<BF16, D, LD, MT>(c[u], a, smem[it & 1], (n0 + u) * 8, lane);
#pragma unroll
            for (int u = 0; u < STEP; ++u) {
                const int col = i0 + (n0 + u) * 8 + 2 * t;
                const float lse0 = col < n_new ? lse_h[col] : INFINITY;  // a padded query adds exp2(-inf) = 0
                const float lse1 = col + 1 < n_new ? lse_h[col + 1] : INFINITY;
#pragma unroll
                for (int m = 0; m < MT; ++m)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        float p = kvlens_exp2(fmaf(c[u][m][j], SCALE_LOG2, -((j & 1) ? lse1 : lse0)));
                        if (!full && k0 + m * 16 + g + (j >> 1) * 8 > first + col + (j & 1)) p = 0.f;
                        acc[m][j >> 1] += p;
                    }
            }
        }
        __syncthreads();
    }
    const int n_prev = prev_shape[1];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float sum = acc[m][r];
            sum += __shfl_xor_sync(0xffffffff, sum, 1);
            sum += __shfl_xor_sync(0xffffffff, sum, 2);
            const int key = k0 + m * 16 + g + r * 8;
            if (t == 0 && key < n_keys)
                sums[(long)h * n_keys + key] = sum + (key < n_prev ? prev[(long)h * n_prev + key] : 0.f);
        }
"""


@dataclass(frozen=True)
class Tuning:
    """The kernels' block shape; `benchmarks/gpu_h2o_tuning.py` measured the defaults against the others.

    warps: per block. row_groups (MT): 16-row groups per warp; each B fragment read from shared memory serves all
    of them, and registers hold MT·head_dim/2 words of A (None: 2 up to head_dim 128, else 1). keys_per_split: keys
    one lse block covers (long contexts split, so every multiprocessor has blocks). lse_step / colsum_step: 8-key
    score tiles multiplied together before their exps (more independent mma chains in flight, more registers)."""

    warps: int = 4
    row_groups: int | None = None
    keys_per_split: int = 8192
    lse_step: int = 4
    colsum_step: int = 1

    def shape(self, head_dim: int) -> tuple[int, int, int]:
        """(MT, TILE, rows per block) for this head_dim. TILE, the rows of one shared-memory tile, keeps two tiles
        of (head_dim + 8) 16-bit columns under the 48 KB of static shared memory."""
        mt = self.row_groups or (2 if head_dim <= 128 else 1)
        return mt, 64 if head_dim <= 128 else 32, self.warps * 16 * mt


DEFAULT_TUNING = Tuning()


@cache
def _kernels(scale: float) -> tuple[Any, Any]:
    """The two kernels for one attention scale (baked into the source: a model has one)."""
    tag, scale_line = scale_source(scale)
    head = scale_line + _COMMON
    lse = mx.fast.cuda_kernel(
        name=f"kvlens_h2o_lse_{tag}",
        input_names=["q", "keys"],
        output_names=["part_max", "part_sum"],
        source=head + _LSE,
        header=_HEADER,
    )
    colsum = mx.fast.cuda_kernel(
        name=f"kvlens_h2o_colsum_{tag}",
        input_names=["q", "keys", "lse", "prev"],
        output_names=["sums"],
        source=head + _COLSUM,
        header=_HEADER,
    )
    return lse, colsum


def fits(q: mx.array, keys: mx.array) -> bool:
    """Whether the kernels can take this chunk: 16-bit queries and keys of one dtype, a head_dim they handle."""
    if q.dtype not in (mx.bfloat16, mx.float16) or keys.dtype != q.dtype:
        return False
    head_dim = q.shape[-1]
    return not (head_dim % 16 or head_dim > MAX_HEAD_DIM or q.shape[0] % keys.shape[0])


def applies(q: mx.array, keys: mx.array) -> bool:
    """`fits`, on CUDA with the kernels on: the check `kvcore.capture.prefill._accumulate_h2o` makes per chunk."""
    return cuda_ready() and fits(q, keys)


def merge_splits(part_max: mx.array, part_sum: mx.array) -> mx.array:
    """One base-2 log-sum-exp per row from the splits' running maxima and sums, [S, H, N] -> [H, N].

    A split a row sees no key of has max -inf and sum 0 and adds nothing; every row sees key 0, in split 0."""
    if part_max.shape[0] == 1:
        return part_max[0] + mx.log2(part_sum[0])
    top = part_max.max(axis=0)
    return top + mx.log2((part_sum * mx.exp((part_max - top) * _LN2)).sum(axis=0))


def _template(q: mx.array, keys: mx.array, tuning: Tuning, step: int) -> list[tuple[str, Any]]:
    mt, tile, _ = tuning.shape(q.shape[-1])
    return [
        ("T", q.dtype),
        ("D", q.shape[-1]),
        ("GROUP", q.shape[0] // keys.shape[0]),
        ("BF16", q.dtype == mx.bfloat16),
        ("WARPS", tuning.warps),
        ("MT", mt),
        ("TILE", tile),
        ("STEP", min(step, tile // 8)),  # a step never spans two tiles
    ]


def log_sum_exp(q: mx.array, keys: mx.array, scale: float, tuning: Tuning = DEFAULT_TUNING) -> mx.array:
    """Each chunk query's base-2 log-sum-exp of its scaled scores over the keys it sees, [H_q, N] float32."""
    n_q_heads, n_new, head_dim = q.shape
    _, _, rows = tuning.shape(head_dim)
    threads = tuning.warps * 32
    splits = -(-keys.shape[1] // tuning.keys_per_split)
    part_max, part_sum = _kernels(float(scale))[0](
        inputs=[q, keys],
        template=[*_template(q, keys, tuning, tuning.lse_step), ("SPLIT", tuning.keys_per_split)],
        grid=(threads * -(-n_new // rows), n_q_heads, splits),
        threadgroup=(threads, 1, 1),
        output_shapes=[(splits, n_q_heads, n_new)] * 2,
        output_dtypes=[mx.float32] * 2,
    )
    return merge_splits(part_max, part_sum)


def column_sums(
    sums: mx.array | None,
    q: mx.array,
    keys: mx.array,
    lse: mx.array,
    scale: float,
    tuning: Tuning = DEFAULT_TUNING,
) -> mx.array:
    """`sums` [H_q, T_prev] (or None) plus each key's sum of exp2(score − lse) over the chunk queries that see it."""
    n_q_heads, _, head_dim = q.shape
    n_keys = keys.shape[1]
    _, _, rows = tuning.shape(head_dim)
    threads = tuning.warps * 32
    prev = sums if sums is not None else mx.zeros((n_q_heads, 1), mx.float32)
    (out,) = _kernels(float(scale))[1](
        inputs=[q, keys, lse, prev],
        template=_template(q, keys, tuning, tuning.colsum_step),
        grid=(threads * -(-n_keys // rows), n_q_heads, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(n_q_heads, n_keys)],
        output_dtypes=[mx.float32],
    )
    return out


def accumulate(
    sums: mx.array | None, q: mx.array, keys: mx.array, scale: float, tuning: Tuning = DEFAULT_TUNING
) -> mx.array:
    """`sums` [H_q, T_prev] (or None) plus this chunk's column sums, [H_q, T_k] float32.

    q: [H_q, N, D], the last N of the T_k positions whose keys [H_kv, T_k, D] are cached (the same contract as
    `kvcore.capture.prefill._accumulate_h2o`)."""
    return column_sums(sums, q, keys, log_sum_exp(q, keys, scale, tuning), scale, tuning)
