"""Time a 1024-token prefill of the bundled demo model on this machine's CPU (or Mac GPU).

Prefill is what the app pays on every "Run", so its figure goes in the README. The weights ship in bfloat16
(size limit); MLX's CPU backend runs half precision without BLAS, so the float32 upcast is timed too.
Run: `.venv/bin/python -m benchmarks.prefill_demo [--tokens 1024] [--runs 5]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)
from kvcore.blas import BLAS_IN_USE
from kvcore.resources import demo_model_dir, prompts_dir


def prompt_ids(tok, n: int) -> list[int]:
    """`n` tokens of real code: the sample prompts, repeated as needed."""
    ids: list[int] = []
    files = sorted(prompts_dir().glob("*.txt"))
    while len(ids) < n:
        for path in files:
            ids.extend(tok.encode(path.read_text()))
    return ids[:n]


def time_prefill(model, ids: list[int], runs: int) -> list[float]:
    """Seconds per prefill into a fresh mlx-lm cache, after one warm-up."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    x = mx.array([ids])
    times = []
    for i in range(runs + 1):
        cache = make_prompt_cache(model)
        start = time.perf_counter()
        mx.eval(model(x, cache=cache), [c.state for c in cache])
        if i:
            times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = p.parse_args(argv)
    import mlx.core as mx  # after kvcore, which loads OpenBLAS
    import mlx_lm

    print(f"device {mx.default_device()}, BLAS {BLAS_IN_USE}, model {demo_model_dir()}")
    for dtype in args.dtypes:
        model, tok = mlx_lm.load(str(demo_model_dir()))
        model.set_dtype(getattr(mx, dtype))
        ids = prompt_ids(tok, args.tokens)
        runs = args.runs if dtype == "float32" else max(1, min(args.runs, 2))
        times = time_prefill(model, ids, runs)
        med = statistics.median(times)
        row = {
            "dtype": dtype,
            "tokens": args.tokens,
            "runs": runs,
            "median_s": round(med, 3),
            "tokens_per_s": round(args.tokens / med, 1),
        }
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
