"""select_positions: the batched path (issue 15) against the per-layer path before it, interleaved in one run.

    python -m benchmarks.bench_select_batched [--contexts 2048 8192] [--repeats 15]

Each repeat runs old then new (then new then old) on the same dense bf16 cache and the same knorm selection
(per-head 2-D, AdaKV ragged), validated and trusted, so load from other processes hits both alike; the best and
median of each are printed with new / old.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import select_positions_before
from benchmarks.bench_recompress import SHAPES, _observations
from benchmarks.common import synthetic_cache
from kvcore.cache import sparse as caches
from kvcore.methods.selection import rank, select

# isort: split
import mlx.core as mx


def _ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def compare(
    name: str, T: int, repeats: int, ratio: float = 0.25
) -> list[tuple[str, float, float, float, float]]:
    """[(case, old best, new best, old median, new median)] at one context."""
    n_layers, n_q, _, _ = SHAPES[name]
    n_kv, d = SHAPES[name][2:]
    dense = synthetic_cache(n_layers, n_kv, d, T, mx.bfloat16)
    ranking = rank(_observations(dense, n_q, T), "knorm")
    out = []
    for label, sel in (
        ("per-head 2-D", select(ranking, ratio)),
        ("AdaKV ragged", select(ranking, ratio, adakv=True)),
    ):
        for validate in (True, False):
            old = lambda s=sel, v=validate: select_positions_before.select_positions(dense, s, validate=v)  # noqa: E731
            new = lambda s=sel, v=validate: caches.select_positions(dense, s, validate=v)  # noqa: E731
            old(), new()
            t_old, t_new = [], []
            for r in range(repeats):
                pair = (old, new) if r % 2 == 0 else (new, old)
                a, b = _ms(pair[0]), _ms(pair[1])
                t_old.append(a if r % 2 == 0 else b)
                t_new.append(b if r % 2 == 0 else a)
            case = f"{label}, {'checked' if validate else 'trusted'}"
            out.append((case, min(t_old), min(t_new), statistics.median(t_old), statistics.median(t_new)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    print(
        "| model | T | case | before best ms | batched best ms | best new/old | before median | batched median | median new/old |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for T in args.contexts:
        for case, ob, nb, om, nm in compare(args.model, T, args.repeats):
            print(
                f"| {args.model} | {T} | {case} | {ob:.2f} | {nb:.2f} | {nb / ob:.2f} | {om:.2f} | {nm:.2f} | {nm / om:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
