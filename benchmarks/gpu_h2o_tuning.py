"""The h2o kernels' block shapes against each other on a GPU: how `kvcore.kernels.h2o_sums.DEFAULT_TUNING` was chosen.

    PYTHONUNBUFFERED=1 python -m benchmarks.gpu_h2o_tuning --out DIR     # on a CUDA GPU (MLX's CUDA backend)

One capture chunk of 2048 queries on the Llama-3.1-8B head layout (32 query heads, 8 kv-heads of 128, bf16) over
8192 and 32768 keys. Each `Tuning` of the lse kernel (warps, row groups, keys per split, step) is timed alone, its
log-sum-exps checked against the default's; each of the colsum kernel (warps, row groups, step) is timed alone on
the default's log-sum-exps, its sums checked against the default's. MLX's fused causal attention over the same chunk
and the kernels before (`benchmarks/h2o_sums_before.py`) are timed beside them. Rounds are interleaved over the
cases (two warm-ups each), each case runs `--reps` launches per timing, medians are reported per launch. Rows go to
DIR/gpu_h2o_tuning.csv, fastest first within each kernel and key length.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks import h2o_sums_before
from benchmarks.common import Row, median_ms
from benchmarks.gpu_bench import H_KV, H_Q, HEAD_DIM, NAME, write
from kvcore import kernels
from kvcore.kernels import h2o_sums
from kvcore.kernels.h2o_sums import DEFAULT_TUNING, Tuning

# isort: split
import mlx.core as mx

CHUNK = 2048
SCALE = HEAD_DIM**-0.5


def _per_launch_ms(cases: dict[str, Callable[[], list[mx.array]]], rounds: int) -> dict[str, float]:
    """`common.median_ms` per launch: each case returns its `reps` launches' outputs."""
    reps = {case: len(fn()) for case, fn in cases.items()}
    return {case: ms / reps[case] for case, ms in median_ms(cases, rounds).items()}


def _lse_tunings() -> list[Tuning]:
    grid = itertools.product((4, 8), (1, 2), (2048, 4096, 8192, 32768), (2, 4, 8))
    return [Tuning(warps=w, row_groups=m, keys_per_split=k, lse_step=s) for w, m, k, s in grid]


def _colsum_tunings() -> list[Tuning]:
    grid = itertools.product((4, 8), (1, 2), (1, 2, 4))
    return [Tuning(warps=w, row_groups=m, colsum_step=s) for w, m, s in grid]


def _label(t: Tuning, kernel: str) -> str:
    step = t.lse_step if kernel == "lse" else t.colsum_step
    split = f", split {t.keys_per_split}" if kernel == "lse" else ""
    return f"warps {t.warps}, row groups {t.shape(HEAD_DIM)[0]}, step {step}{split}"


def _launches(
    kernel: str, t: Tuning, reps: int, q: mx.array, keys: mx.array, prev: mx.array | None, lse: mx.array
) -> Callable[[], list[mx.array]]:
    if kernel == "lse":
        return lambda: [h2o_sums.log_sum_exp(q, keys, SCALE, t) for _ in range(reps)]
    return lambda: [h2o_sums.column_sums(prev, q, keys, lse, SCALE, t) for _ in range(reps)]


def tuning_rows(n_keys: int, rounds: int, reps: int) -> list[Row]:
    rng = np.random.default_rng(n_keys)
    q = mx.array(rng.standard_normal((H_Q, CHUNK, HEAD_DIM)), mx.bfloat16)
    keys = mx.array(rng.standard_normal((H_KV, n_keys, HEAD_DIM)), mx.bfloat16)
    prev = mx.array(rng.random((H_Q, n_keys - CHUNK)) * 4, mx.float32) if n_keys > CHUNK else None
    mx.eval([x for x in (q, keys, prev) if x is not None])
    lse_ref = h2o_sums.log_sum_exp(q, keys, SCALE)
    sums_ref = h2o_sums.column_sums(prev, q, keys, lse_ref, SCALE)
    mx.eval(lse_ref, sums_ref)
    ref_lse, ref_sums = np.asarray(lse_ref), np.asarray(sums_ref)
    qa, ka = q[None], keys[None]
    rows: list[Row] = []
    for kernel, tunings in (("lse", _lse_tunings()), ("colsum", _colsum_tunings())):
        cases: dict[str, Callable[[], list[mx.array]]] = {}
        err: dict[str, float] = {}
        for t in tunings:
            fn = _launches(kernel, t, reps, q, keys, prev, lse_ref)
            got = np.asarray(fn()[0])
            if kernel == "lse":
                err[_label(t, kernel)] = float(np.abs(got - ref_lse).max())
            else:
                err[_label(t, kernel)] = float((np.abs(got - ref_sums) / np.maximum(ref_sums, 1e-30)).max())
            cases[_label(t, kernel)] = fn
        cases["MLX fused causal attention"] = lambda: [
            mx.fast.scaled_dot_product_attention(qa, ka, ka, scale=SCALE, mask="causal") for _ in range(reps)
        ]
        cases["both kernels before (h2o_sums_before.accumulate)"] = lambda: [
            h2o_sums_before.accumulate(prev, q, keys, SCALE) for _ in range(reps)
        ]
        ms = _per_launch_ms(cases, rounds)
        default = _label(DEFAULT_TUNING, kernel)
        for case in sorted(ms, key=ms.get):
            unit = "max abs err (log2)" if kernel == "lse" else "max rel err"
            note = (
                f"{'DEFAULT; ' if case == default else ''}{unit} vs default {err[case]:.2e}"
                if case in err
                else ""
            )
            rows.append(Row(bench=f"h2o {kernel} tuning", case=case, model=NAME, context=n_keys, value=ms[case],
                            unit="ms", baseline=ms[default], ratio=ms[case] / ms[default], note=note))  # fmt: skip
        best = min((c for c in ms if c in err), key=ms.get)
        print(f"  {kernel} keys={n_keys}: default {ms[default]:.3f} ms, best {best} {ms[best]:.3f} ms "
              f"(err {err[best]:.1e}); fused attention {ms['MLX fused causal attention']:.3f} ms", flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--key-lengths", type=int, nargs="+", default=[8192, 32768])
    args = ap.parse_args(argv)
    if not kernels.cuda_ready():
        ap.error("needs MLX's CUDA backend with the kernels on: the kernels run nowhere else")
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows: list[Row] = []
    for n_keys in args.key_lengths:
        rows += tuning_rows(n_keys, args.rounds, args.reps)
        write(rows, args.out / "gpu_h2o_tuning.csv")
        print(f"[{time.perf_counter() - t0:.0f} s] keys={n_keys} done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
