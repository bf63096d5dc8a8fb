"""Decoding-time policies on the demo model (issue 40): speed and quality against the dense continuation.

    python -m benchmarks.decode_policies --tokens 1024 --budgets 128,256,512 [--speed-only | --quality-only]

Speed: free-running greedy decode of --tokens under a policy at interval 16 and 64 against the same length with no
eviction (one run each, this CPU); the cost of one compression step is the extra time over the compressions.
Quality: per policy and budget, the free-running tokens' agreement with the dense continuation and the first step
where they differ, and the mean KL(dense ‖ policy) of the next-token distributions, teacher-forced on the dense
continuation (both sides read the same tokens, so KL isolates the cache). The dense continuation is computed once,
at the prefill, and reused for every setting.
"""

from __future__ import annotations

import argparse
import sys
import time

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx
import numpy as np

from benchmarks.common import ROOT
from kvcore.engine.decoding import DECODE_METHODS, DecodingPolicy, decode_with_policy
from kvcore.engine.session import CompressionConfig, Session
from kvcore.measure.metrics import first_divergence

NO_EVICTION = 10**9
DMS_THRESHOLD_QUANTILE = (
    0.5  # dms: the median key score of the prompt's layer-0 keys, so it evicts about half
)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _forced_logprobs(session: Session, state, policy: DecodingPolicy, n: int) -> np.ndarray:
    rows: list[mx.array] = []
    decode_with_policy(session, state, policy, n, forced=session.dense_tokens, on_logits=rows.append)
    return _log_softmax(np.array(mx.stack(rows).astype(mx.float32), dtype=np.float64))


def _timed(session: Session, state, policy: DecodingPolicy, n: int) -> tuple[float, int, float]:
    start = time.perf_counter()
    run = decode_with_policy(session, state, policy, n)
    return time.perf_counter() - start, len(run.compressions), run.evict_seconds


def speed(session: Session, state, n: int, budget: int) -> None:
    print(f"\n### Speed: {n} tokens, budget {budget}, this CPU, one run each\n")
    print("| policy | interval | tok/s | plain tok/s | ratio | compressions | ms per compression |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    no_eviction = DecodingPolicy("knorm", budget=NO_EVICTION, interval=n + 1)
    _timed(session, state, no_eviction, min(n, 32))  # warm-up
    plain, _, _ = _timed(session, state, no_eviction, n)
    for method in ("streaming_llm", "knorm", "snapkv", "h2o_online"):
        for interval in (16, 64):
            policy = DecodingPolicy(method, budget=budget, interval=interval)
            seconds, count, evicting = _timed(session, state, policy, n)
            extra = evicting / count * 1e3 if count else float("nan")
            print(
                f"| {method} | {interval} | {n / seconds:.0f} | {n / plain:.0f} | {plain / seconds:.2f} | "
                f"{count} | {extra:.1f} |",
                flush=True,
            )


def quality(
    session: Session, state, n: int, budgets: list[int], threshold: float, methods: list[str]
) -> None:
    print(f"\n### Quality: {n} tokens against the dense continuation (interval 16)\n")
    print("| policy | budget | KL mean | KL max | agreement | first divergence | max cache rows |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    dense = _forced_logprobs(session, state, DecodingPolicy("knorm", budget=NO_EVICTION, interval=n + 1), n)
    tokens = session.dense_tokens[:n]
    for method in methods:
        for budget in budgets:
            extra = {"threshold": threshold} if method == "dms" else {}
            policy = DecodingPolicy(method, budget=budget, interval=16, **extra)
            ours = _forced_logprobs(session, state, policy, n)
            kl = (np.exp(dense) * (dense - ours)).sum(axis=-1)
            run = decode_with_policy(session, state, policy, n)
            same = np.mean([a == b for a, b in zip(tokens, run.tokens, strict=False)])
            div = first_divergence(tokens, run.tokens)
            print(
                f"| {method} | {budget} | {kl.mean():.4f} | {kl.max():.3f} | {same:.3f} | "
                f"{'—' if div is None else div} | {run.max_cache_tokens} |",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--budgets", default="128,256,512")
    p.add_argument("--prompt", default="needle_in_code", help="a sample of resources/prompts")
    p.add_argument("--methods", default=",".join(DECODE_METHODS), help="the policies of the quality table")
    p.add_argument("--speed-only", action="store_true")
    p.add_argument("--quality-only", action="store_true")
    args = p.parse_args(argv)
    session = Session.load(str(ROOT / "resources" / "models" / "kvlens-demo"))
    text = (ROOT / "resources" / "prompts" / f"{args.prompt}.txt").read_text()
    start = time.perf_counter()
    session.prefill(text, n_tokens=args.tokens, chat_template=False)
    print(
        f"prefill {len(session.prompt_ids)} tokens + dense continuation of {args.tokens}: "
        f"{time.perf_counter() - start:.1f} s",
        flush=True,
    )
    state = session.compress(CompressionConfig("full", 1.0))
    keys = state.cache[0].keys_and_values()[0][0].astype(mx.float32)
    norms = np.array(mx.sqrt((keys * keys).sum(axis=-1)))
    threshold = -float(np.quantile(norms, DMS_THRESHOLD_QUANTILE))
    if not args.quality_only:
        speed(session, state, args.tokens, 256)
    if not args.speed_only:
        budgets = [int(b) for b in args.budgets.split(",")]
        quality(session, state, args.tokens, budgets, threshold, args.methods.split(","))
    return 0


if __name__ == "__main__":
    sys.exit(main())
