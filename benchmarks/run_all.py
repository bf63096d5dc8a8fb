"""Every KV Lens benchmark side by side in one run: a table on stdout, a CSV, and the profile evidence.

Run: .venv/bin/python -m benchmarks.run_all [--quick] [--csv out.csv] [--no-blas-compare]
(`make bench` runs it with the defaults). BENCHMARKS.md explains every figure and the choices behind it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)

# isort: split
import mlx.core as mx

from benchmarks import bench_decode, bench_env, bench_prefill, bench_profile, bench_recompress
from benchmarks.common import Row, build, judge, model_names

FULL = {
    # model -> layers kept of the real shape (decode, prefill); None = all
    "decode_layers": {"llama-3.2-1b": 4, "qwen3-0.6b": 4, "kvlens-demo": None},
    "decode_contexts": [512, 2048, 8192],
    "ratio_contexts": [2048, 8192],
    "decode_tokens": 6,
    "decode_rounds": 3,
    "prefill_layers": {"llama-3.2-1b": 2, "qwen3-0.6b": 4, "kvlens-demo": None},
    "prefill_contexts": {"llama-3.2-1b": [512], "qwen3-0.6b": [512, 2048], "kvlens-demo": [512, 2048]},
    "prefill_rounds": 2,
    "recompress": {"llama-3.2-1b": [1024, 2048, 4096, 8192], "qwen3-0.6b": [2048, 8192]},
    "recompress_repeats": 3,
    "profile_T": (512, 4096),
}
QUICK = {
    "decode_layers": {"llama-3.2-1b": 1},
    "decode_contexts": [512],
    "ratio_contexts": [512],
    "decode_tokens": 3,
    "decode_rounds": 1,
    "prefill_layers": {"qwen3-0.6b": 1},
    "prefill_contexts": {"qwen3-0.6b": [256]},
    "prefill_rounds": 1,
    "recompress": {"llama-3.2-1b": [512, 2048]},
    "recompress_repeats": 2,
    "profile_T": (256, 1024),
}


def subset(quick: bool) -> list[Row]:
    """The rows measured with and without OpenBLAS (each in its own process): decode and prefill, 1 layer."""
    model = build("qwen3-0.6b", 1)
    rows = bench_decode.run(model, "qwen3-0.6b", [512], 3 if quick else 4, 1 if quick else 2, [])
    rows = [r for r in rows if r.case in ("mlx-lm KVCache", "kvcore B0")]
    rows += [r for r in bench_prefill.run(model, "qwen3-0.6b", [256], 1, False) if "first h2o" not in r.case]
    from kvcore.blas import BLAS_IN_USE

    for r in rows:
        r.note = f"BLAS: {BLAS_IN_USE.split(' (')[0]}"
    return rows


def summary(rows: list[Row]) -> list[Row]:
    """Geometric mean of each decode ratio over every model and context: one noisy round matters less."""
    out = []
    for prefix, target, low in (
        ("kvcore B0", ">= 0.97x mlx-lm KVCache", 0.97),
        ("kvcore quantize_cache 4b", ">= 0.97x mlx-lm at 4 bits", 0.97),
        ("kvcore quantize_cache 8b", ">= 0.97x mlx-lm at 8 bits", 0.97),
    ):
        ratios = [r.ratio for r in rows if r.bench == "decode" and r.case == prefix and r.ratio > 0]
        if ratios:
            gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            row = Row(
                bench="summary", case=f"{prefix}: geometric mean of {len(ratios)} ratios", target=target
            )
            row.value, row.unit = gm, "x"
            row.note = f"min {min(ratios):.3f}, max {max(ratios):.3f}"
            out.append(judge(row, gm, minimum=low))
    return out


def fmt(x: float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return ""
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def table(rows: list[Row]) -> str:
    head = [
        "bench",
        "case",
        "model",
        "T",
        "L",
        "value",
        "unit",
        "baseline",
        "ratio",
        "target",
        "ok",
        "peak MiB",
    ]
    body = [
        [r.bench, r.case, r.model, str(r.context or ""), str(r.layers or ""), fmt(r.value), r.unit,
         fmt(r.baseline), fmt(r.ratio), r.target, r.ok, fmt(r.peak_mb)]
        for r in rows
    ]  # fmt: skip
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)) for line in [head, *body]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run (< 1 min): one small case per item")
    ap.add_argument("--csv", type=Path, default=Path("benchmarks/results.csv"), help="where to write the CSV")
    ap.add_argument("--no-blas-compare", action="store_true", help="skip the run without OpenBLAS")
    ap.add_argument("--subset", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.subset:
        print(json.dumps([asdict(r) for r in subset(args.quick)]))
        return 0
    plan = QUICK if args.quick else FULL
    start = time.perf_counter()
    env = bench_env.machine()
    print("machine:", json.dumps(env))
    rows: list[Row] = []
    names = model_names()
    for name in names:
        if name not in plan["decode_layers"]:
            continue
        model = build(name, plan["decode_layers"][name])
        rows += bench_decode.run(
            model, name, plan["decode_contexts"], plan["decode_tokens"], plan["decode_rounds"],
            plan["ratio_contexts"],
        )  # fmt: skip
        print(f"[{time.perf_counter() - start:5.0f} s] decode {name} done", file=sys.stderr)
        del model
    for name in names:
        if name not in plan["prefill_layers"]:
            continue
        model = build(name, plan["prefill_layers"][name])
        rows += bench_prefill.run(
            model, name, plan["prefill_contexts"][name], plan["prefill_rounds"], eager_h2o=True
        )
        print(f"[{time.perf_counter() - start:5.0f} s] prefill {name} done", file=sys.stderr)
        del model
    for name, contexts in plan["recompress"].items():
        rows += bench_recompress.run(name, contexts, plan["recompress_repeats"])
    print(f"[{time.perf_counter() - start:5.0f} s] recompress done", file=sys.stderr)
    rows += bench_env.heatmap()
    if not (args.quick or args.no_blas_compare):
        rows += bench_env.blas_subset(args.quick)
    rows += summary(rows)
    mx.clear_cache()
    profile = bench_profile.run(build("llama-3.2-1b", 1), plan["profile_T"])
    print(table(rows))
    print()
    print(profile)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    dicts = [r.csv() for r in rows]
    fields = list(dict.fromkeys(k for d in dicts for k in d))
    with args.csv.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(dicts)
    args.csv.with_suffix(".profile.txt").write_text(profile + "\n\nmachine: " + json.dumps(env) + "\n")
    missed = [r for r in rows if r.ok == "NO"]
    print(
        f"\n{len(rows)} rows -> {args.csv}; targets missed: {len(missed)}; {time.perf_counter() - start:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
