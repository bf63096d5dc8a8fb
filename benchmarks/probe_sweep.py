"""Needle recall of a model under each method, and what the probe sweep costs per configuration, on this machine.

Held-out probe families and filler (never trained on), lengths 600–1,700 tokens, needle depth uniform in
[0.1, 0.9], one prefill per probe and every configuration recompressed from it; both schedules. Prints the
recall table, seconds per prefill and per configuration, and the 1,024-token prefill time, so a model can be
compared with another in one run (`--model` twice: old and new demo model).
Run: `.venv/bin/python -m benchmarks.probe_sweep [--model DIR ...] [--probes 30]`.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import kvcore  # noqa: F401  (loads the optimized BLAS before mlx)
from benchmarks.prefill_demo import prompt_ids, time_prefill
from kvcore.engine.session import CompressionConfig, Session
from kvcore.probes import HELDOUT_FAMILIES, make_probe
from kvcore.probes.scoring import config_rows, probe_rows, recall_table
from kvcore.resources import demo_model_dir

METHODS = ("snapkv", "adakv", "pyramidkv", "h2o", "tova", "streaming_llm", "random", "knorm")


def probes(tokenizer, n: int, seed: int = 7):
    rng = random.Random(seed)
    return [
        make_probe(
            tokenizer,
            seed=seed * 1000 + i,
            depth=rng.uniform(0.1, 0.9),
            n_tokens=rng.randint(600, 1700),
            family=HELDOUT_FAMILIES[i % len(HELDOUT_FAMILIES)],
        )
        for i in range(n)
    ]


def measure(model: str, n: int, ratios: list[float], schedules: list[str], methods: list[str]) -> dict:
    session = Session.load(model)
    ids = prompt_ids(session.tokenizer, 1024)
    prefill_1024 = statistics.median(time_prefill(session.model, ids, 3))
    configs = [
        CompressionConfig(method=m, ratio=r, schedule=s) for s in schedules for r in ratios for m in methods
    ]
    rows, prefill_s, config_s = [], [], []
    for probe in probes(session.tokenizer, n):
        start = time.perf_counter()
        dense = probe_rows(session, probe, [])
        prefill_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        rows += dense + config_rows(session, probe, configs)
        config_s.append((time.perf_counter() - start) / len(configs))
    table = recall_table(rows)
    return {
        "model": model,
        "probes": n,
        "prefill_1024_tokens_s": prefill_1024,
        "probe_prefill_s_median": statistics.median(prefill_s),
        "per_config_s_median": statistics.median(config_s),
        "recall": {f"{k[0]} {k[1]} r={k[2]}".strip(): v for k, v in sorted(table.items())},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "--model", action="append", help="model folder (repeat to compare); default: the demo model"
    )
    p.add_argument("--probes", type=int, default=30)
    p.add_argument("--ratios", default="0.25,0.5")
    p.add_argument("--schedules", default="paper,mlx-lm")
    p.add_argument("--methods", default=",".join(METHODS))
    args = p.parse_args(argv)
    ratios = [float(r) for r in args.ratios.split(",")]
    for model in args.model or [str(demo_model_dir())]:
        out = measure(model, args.probes, ratios, args.schedules.split(","), args.methods.split(","))
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
