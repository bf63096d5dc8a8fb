"""Capture with expected_attention's pre-RoPE query statistics on vs off, side by side (target <= 1.15x).

Both cases are `Session.prefill`'s capture (window 256, h2o deferred, last token held back) of the same
~1024-token prompt on the bundled demo model; the rounds alternate on/off so drift on a shared machine hits
both. "on" also computes the mean future rotation and evaluates the statistics of both schedules.
Run: `.venv/bin/python -m benchmarks.bench_query_stats [--tokens 1024] [--rounds 7] [--dtype float32]`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)
from benchmarks.prefill_demo import prompt_ids
from kvcore.blas import BLAS_IN_USE
from kvcore.defaults import CAPTURE_WINDOW
from kvcore.resources import demo_model_dir

TARGET = 1.15


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dtype", default="float32", help="the demo model ships bf16; CPU BLAS needs float32")
    args = p.parse_args(argv)
    import mlx.core as mx
    import mlx_lm

    from kvcore.capture.prefill import prefill_with_capture

    model, tok = mlx_lm.load(str(demo_model_dir()))
    model.set_dtype(getattr(mx, args.dtype))
    ids = prompt_ids(tok, args.tokens)

    def capture(stats: bool) -> float:
        start = time.perf_counter()
        prefill_with_capture(model, ids, window=CAPTURE_WINDOW, h2o="lazy", hold_last=True, query_stats=stats)
        return (time.perf_counter() - start) * 1e3

    capture(True), capture(False)  # warm-up
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for stats in (False, True) if r % 2 == 0 else (True, False):
            times[stats].append(capture(stats))
    print(f"device {mx.default_device()}, BLAS {BLAS_IN_USE}, demo model {args.dtype}, {len(ids)} tokens")
    print(f"{'round':>5} {'stats off ms':>13} {'stats on ms':>12} {'ratio':>6}")
    for r, (off, on) in enumerate(zip(times[False], times[True], strict=True)):
        print(f"{r:>5} {off:>13.1f} {on:>12.1f} {on / off:>6.3f}")
    off, on = statistics.median(times[False]), statistics.median(times[True])
    ratio = on / off
    verdict = "PASS" if ratio <= TARGET else "FAIL"
    print(f"median {off:>12.1f} {on:>12.1f} {ratio:>6.3f}  target <= {TARGET}x: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
