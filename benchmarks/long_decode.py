"""A long generation under a decoding policy on the demo model (issue 40): wall time, peak memory, and what the
run's per-compression records weigh, to check that --tokens 8192 is practical.

    python -m benchmarks.long_decode --tokens 2048 --method streaming_llm --budget 256 --interval 16

Prints the prefill time (with the dense continuation of --tokens, computed once), the policy decode's time and
tok/s, the process's peak RSS, the bytes of `DecodingRun.compressions` (kept positions) and a linear extrapolation
to 8192 tokens.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import numpy as np

from benchmarks.common import ROOT
from kvcore.engine.decoding import DecodingPolicy, decode_with_policy
from kvcore.engine.session import CompressionConfig, Session

LONG = 8192


def record_bytes(obj: object, seen: set[int] | None = None) -> int:
    """Bytes held by lists / tuples / ints / NumPy arrays reachable from `obj` (each object once)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return sys.getsizeof(obj)
    size = sys.getsizeof(obj)
    if isinstance(obj, list | tuple):
        size += sum(record_bytes(x, seen) for x in obj)
    elif hasattr(obj, "__dataclass_fields__"):
        size += sum(record_bytes(getattr(obj, f), seen) for f in obj.__dataclass_fields__)
    return size


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--method", default="streaming_llm")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--interval", type=int, default=16)
    p.add_argument("--prompt", default="plain_code", help="a sample of resources/prompts")
    p.add_argument(
        "--prompt-tokens", type=int, default=32, help="its first N tokens (the demo's context is 2048)"
    )
    args = p.parse_args(argv)
    session = Session.load(str(ROOT / "resources" / "models" / "kvlens-demo"))
    text = (ROOT / "resources" / "prompts" / f"{args.prompt}.txt").read_text()
    ids = list(session.tokenizer.encode(text))[: args.prompt_tokens]
    start = time.perf_counter()
    session.prefill(ids, n_tokens=args.tokens, chat_template=False)
    prefill = time.perf_counter() - start
    rss_prefill = _peak_rss_mb()
    state = session.compress(CompressionConfig("full", 1.0))
    policy = DecodingPolicy(args.method, budget=args.budget, interval=args.interval)
    start = time.perf_counter()
    run = decode_with_policy(session, state, policy, args.tokens)
    decode = time.perf_counter() - start
    kept = record_bytes(run.compressions) + record_bytes(run.start_kept)
    steps = record_bytes(run.steps)
    scale = LONG / args.tokens
    print(f"prompt {len(session.prompt_ids)} tokens; {args.tokens} tokens under {policy.label()}")
    print(f"prefill + dense continuation: {prefill:.1f} s (peak RSS {rss_prefill:.0f} MB)")
    print(
        f"policy decode: {decode:.1f} s, {len(run.tokens) / decode:.1f} tok/s, {len(run.compressions)} "
        f"compressions, {run.evict_seconds * 1e3:.0f} ms evicting; max cache rows {run.max_cache_tokens}"
    )
    print(
        f"peak RSS {_peak_rss_mb():.0f} MB; compressions' kept positions {kept / 2**20:.1f} MiB, steps {steps / 2**20:.1f} MiB"
    )
    print(
        f"extrapolated to {LONG}: prefill + dense {prefill * scale:.0f} s (linear; dense attention grows), "
        f"policy decode {decode * scale:.0f} s, kept positions {kept * scale / 2**20:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
