"""Scoring time of kvpress's scorers against snapkv's, at 2k and 8k tokens (Llama-3.2-1B's attention shape).

Per layer 32 query heads, 8 kv-heads, head_dim 64, RoPE base 500000; keys, values and queries are random normal
float32 (scoring cost does not depend on the values), given to each method as capture would: the last 64 queries,
every prompt query (a CPU prefill keeps them), the pre-RoPE query statistics and the rope module. The time is one
layer's `scores` evaluated (median of --rounds, after one warm-up that also computes the future rotation), times
--layers. Run: `.venv/bin/python -m benchmarks.bench_scoring [--tokens 2048,8192] [--layers 4] [--rounds 3]`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx
import mlx.nn as nn

from kvcore import methods
from kvcore.capture import query_stats
from kvcore.capture.prefill import LayerObservation
from kvcore.defaults import CAPTURE_WINDOW

N_Q, N_KV, HEAD_DIM, ROPE_BASE = 32, 8, 64, 500000.0
METHODS = ("snapkv", "expected_attention", "leverage", "cur", "non_causal_attention", "compactor", "cap")


def observation(n_tokens: int, seed: int) -> LayerObservation:
    mx.random.seed(seed)
    rope = nn.RoPE(HEAD_DIM, base=ROPE_BASE)
    pre_q = mx.random.normal((N_Q, n_tokens, HEAD_DIM))
    queries = rope(pre_q[None])[0]
    keys = rope(mx.random.normal((1, N_KV, n_tokens, HEAD_DIM)))[0]
    values = mx.random.normal((N_KV, n_tokens, HEAD_DIM))
    stats = query_stats.accumulate(None, pre_q, 0)
    stats.rope = rope
    obs = LayerObservation(
        keys=keys,
        window_queries=queries[:, -CAPTURE_WINDOW:],
        h2o_sums=None,
        n_q_heads=N_Q,
        n_kv_heads=N_KV,
        scale=HEAD_DIM**-0.5,
        pending_queries=[queries],
        values=values,
        query_stats=stats,
        rope=rope,
    )
    mx.eval(keys, values, queries, stats.arrays())
    return obs


def seconds(method: methods.Method, obs: LayerObservation, rounds: int) -> float:
    mx.eval(method.scores(obs, 0))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        mx.eval(method.scores(obs, 0))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="2048,8192")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--methods", default=",".join(METHODS))
    args = p.parse_args(argv)
    sizes = [int(t) for t in args.tokens.split(",")]
    chosen = [m for m in args.methods.split(",") if m]
    table = {}
    for n_tokens in sizes:
        obs = observation(n_tokens, 0)
        for name in chosen:
            table[name, n_tokens] = seconds(methods.get(name), obs, args.rounds) * args.layers
            print(f"{name} at {n_tokens}: {table[name, n_tokens] * 1e3:.0f} ms", flush=True)
    print(f"\n| method | {' | '.join(f'{n} tokens (ms, {args.layers} layers)' for n in sizes)} | vs snapkv |")
    print(f"| --- | {' | '.join('---:' for _ in sizes)} | ---: |")
    for name in chosen:
        cells = " | ".join(f"{table[name, n] * 1e3:.0f}" for n in sizes)
        ratio = (
            " / ".join(f"{table[name, n] / table['snapkv', n]:.1f}x" for n in sizes)
            if "snapkv" in chosen
            else ""
        )
        print(f"| {name} | {cells} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
