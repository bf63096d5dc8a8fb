"""Long generations under decoding policies on the demo model (issue 40): wall time, peak memory, cache size and
the timeline CSV's size, to check that --tokens 8192 is practical; and the dense reference pass in chunks against
one shot.

    python -m benchmarks.long_decode --tokens 8192 --beyond-context --methods snapkv,streaming_llm --interval 64
    python -m benchmarks.long_decode --reference 2000   # chunked against one-shot, each in its own process
    python -m benchmarks.long_decode --timeline-job --tokens 8192 --beyond-context --methods snapkv --interval 64

The first form prefills once (with the dense continuation of --tokens and its teacher-forced reference passes,
computed once) and then decodes --tokens under each policy from that one session, side by side. The demo model's
trained context is 2,048 positions: past it only with --beyond-context (RoPE extrapolates).

The second runs the teacher-forced reference pass over N tokens in a fresh process per mode (so each peak RSS is
its own): fed in chunks of REFERENCE_CHUNK, and as one pass of all N tokens (what Session did before).

The third runs the app's Timeline job (app.engine.timeline_jobs.decode_timeline: the policy with the dense cache in
lockstep, what the Timeline dock runs on its engine thread) outside Qt, counting its progress reports.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx
import numpy as np

from benchmarks.common import ROOT
from kvcore.defaults import REFERENCE_CHUNK
from kvcore.engine.decoding import DecodingPolicy, decode_with_policy
from kvcore.engine.session import CompressionConfig, Session
from kvcore.engine.timeline import of_run, write_timeline_csv

DEMO = ROOT / "resources" / "models" / "kvlens-demo"
#: One shot: a chunk longer than any feed.
ONE_SHOT = 1 << 30


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


def _prompt_ids(session: Session, name: str, n: int) -> list[int]:
    text = (ROOT / "resources" / "prompts" / f"{name}.txt").read_text()
    return list(session.tokenizer.encode(text))[:n]


def long_runs(args: argparse.Namespace) -> None:
    session = Session.load(str(DEMO))
    ids = _prompt_ids(session, args.prompt, args.prompt_tokens)
    mx.reset_peak_memory()
    start = time.perf_counter()
    session.prefill(ids, n_tokens=args.tokens, chat_template=False, beyond_context=args.beyond_context)
    prefill = time.perf_counter() - start
    print(
        f"prompt {len(session.prompt_ids)} tokens + dense continuation of {args.tokens} (beyond context: "
        f"{session.beyond_context}): {prefill:.1f} s, peak RSS {_peak_rss_mb():.0f} MB, MLX peak "
        f"{mx.get_peak_memory() / 2**20:.0f} MiB",
        flush=True,
    )
    mx.reset_peak_memory()
    start = time.perf_counter()
    session.dense_reference("paper")  # what `kvlens compress` measures against (the paper schedule's pass)
    print(
        f"dense reference (teacher-forced, chunks of {REFERENCE_CHUNK}): {time.perf_counter() - start:.1f} s, "
        f"peak RSS {_peak_rss_mb():.0f} MB, MLX peak {mx.get_peak_memory() / 2**20:.0f} MiB",
        flush=True,
    )
    state = session.compress(CompressionConfig("full", 1.0))
    rows = []
    for method in args.methods.split(","):
        policy = DecodingPolicy(method, budget=args.budget, interval=args.interval)
        mx.reset_peak_memory()
        start = time.perf_counter()
        run = decode_with_policy(session, state, policy, args.tokens)
        decode = time.perf_counter() - start
        dense = session.dense_tokens[: len(run.tokens)]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.csv")
            n_rows = write_timeline_csv(path, of_run(run))
            csv_bytes = os.path.getsize(path)
        row = {
            "policy": policy.label(),
            "decode_s": round(decode, 1),
            "tok_s": round(len(run.tokens) / decode, 1),
            "compressions": len(run.compressions),
            "evict_ms_per": round(run.evict_seconds * 1e3 / max(len(run.compressions), 1), 1),
            "max_cache_tokens": run.max_cache_tokens,
            "agreement": round(sum(a == b for a, b in zip(dense, run.tokens, strict=False)) / len(dense), 3),
            "peak_rss_mb": round(_peak_rss_mb()),
            "mlx_peak_mib": round(mx.get_peak_memory() / 2**20),
            "records_mib": round((record_bytes(run.compressions) + record_bytes(run.start_kept)) / 2**20, 1),
            "timeline_rows": n_rows,
            "timeline_mib": round(csv_bytes / 2**20, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"reference passes after every policy: {session.reference_passes} (computed once, reused)")


def reference_mode(args: argparse.Namespace) -> None:
    """One teacher-forced reference pass of args.reference tokens at args.chunk, in this process."""
    session = Session.load(str(DEMO))
    ids = _prompt_ids(session, args.prompt, args.prompt_tokens)
    session.prefill(ids, n_tokens=1, chat_template=False)
    text = "".join(
        (ROOT / "resources" / "prompts" / f"{p}.txt").read_text() for p in ("plain_code", "needle_in_code")
    )
    feed = list(session.tokenizer.encode(text))
    feed = (feed * (args.reference // len(feed) + 1))[: args.reference]
    cache = session._observed("paper").cache
    rss_before = _peak_rss_mb()
    mx.reset_peak_memory()
    start = time.perf_counter()
    logits = session._reference_logits(cache, "paper", feed, chunk=args.chunk)
    seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "tokens": args.reference,
                "chunk": "one shot" if args.chunk >= ONE_SHOT else args.chunk,
                "seconds": round(seconds, 2),
                "peak_rss_mb": round(_peak_rss_mb()),
                "rss_before_mb": round(rss_before),
                "mlx_peak_mib": round(mx.get_peak_memory() / 2**20),
                "logits_mib": round(logits.nbytes / 2**20),
            }
        ),
        flush=True,
    )


def timeline_job(args: argparse.Namespace) -> None:
    """The Timeline dock's job at --tokens under the first of --methods, from the full prefill cache."""
    from types import SimpleNamespace

    from app.engine.timeline_jobs import decode_timeline

    session = Session.load(str(DEMO))
    session.prefill(_prompt_ids(session, args.prompt, args.prompt_tokens), n_tokens=1, chat_template=False)
    reports: list[str] = []
    ctx = SimpleNamespace(
        state={"session": session},
        progress=lambda fraction, text="": reports.append(text),
        cancelled=lambda: False,
    )
    policy = {
        "method": args.methods.split(",")[0],
        "budget": args.budget,
        "interval": args.interval,
        "n_sink": 4,
    }
    job = decode_timeline(policy, args.tokens, None, beyond_context=args.beyond_context)
    mx.reset_peak_memory()
    start = time.perf_counter()
    view = job(ctx)
    seconds = time.perf_counter() - start
    row = {
        "policy": policy,
        "tokens": view.n_generated,
        "seconds": round(seconds, 1),
        "tok_s": round(view.n_generated / seconds, 1),
        "beyond_context": view.beyond_context,
        "progress_reports": len(reports),
        "last_report": reports[-1] if reports else "",
        "max_cache_tokens": view.max_cache_tokens,
        "mean_kl": round(float(np.mean(view.token_steps.kl)), 4),
        "first_divergence": view.token_steps.first_divergence,
        "peak_rss_mb": round(_peak_rss_mb()),
        "mlx_peak_mib": round(mx.get_peak_memory() / 2**20),
    }
    print(json.dumps(row), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--methods", default="streaming_llm", help="decoding policies, comma-separated")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--interval", type=int, default=16)
    p.add_argument(
        "--beyond-context", action="store_true", help="allow prompt + tokens past the trained context"
    )
    p.add_argument("--prompt", default="plain_code", help="a sample of resources/prompts")
    p.add_argument("--prompt-tokens", type=int, default=32, help="its first N tokens")
    p.add_argument(
        "--reference", type=int, help="time the reference pass over N tokens, chunked and one-shot"
    )
    p.add_argument("--chunk", type=int, help=argparse.SUPPRESS)  # one --reference mode, in a child process
    p.add_argument("--timeline-job", action="store_true", help="run the Timeline dock's job (no Qt)")
    args = p.parse_args(argv)
    if args.timeline_job:
        timeline_job(args)
    elif args.reference is None:
        long_runs(args)
    elif args.chunk is not None:
        reference_mode(args)
    else:
        for chunk in (REFERENCE_CHUNK, ONE_SHOT):
            cmd = [sys.executable, "-m", "benchmarks.long_decode", "--reference", str(args.reference)]
            subprocess.run([*cmd, "--chunk", str(chunk)], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
