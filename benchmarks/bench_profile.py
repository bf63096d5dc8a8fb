"""Evidence that decode and recompress do no per-token whole-cache copies and no Python loops over positions.

Counts, over N decode steps, the MLX ops that could copy a layer (`concatenate`, `take`, `zeros`) as called from
kvcore, and reports cProfile's busiest kvcore functions with their call counts: per-step counts must be constant
(not growing with T) and a layer-growing concatenate may happen only once per 256 tokens.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from benchmarks.bench_decode import decode
from benchmarks.common import synthetic_cache
from kvcore.cache import sparse as caches
from kvcore.capture.prefill import LayerObservation
from kvcore.methods.selection import rank, select
from kvcore.model import attention

WATCHED = ("concatenate", "take", "zeros", "take_along_axis")


@contextmanager
def counting(module: Any) -> Iterator[Counter]:
    """Count calls of the WATCHED mx functions made through `module.mx`."""
    counts: Counter = Counter()
    real = module.mx

    class Spy:
        def __getattr__(self, name: str) -> Any:
            attr = getattr(real, name)
            if name in WATCHED:

                def wrapped(*a: Any, **k: Any) -> Any:
                    counts[name] += 1
                    return attr(*a, **k)

                return wrapped
            return attr

    module.mx = Spy()
    try:
        yield counts
    finally:
        module.mx = real


def top(fn: Callable[[], Any], n: int = 8) -> str:
    """cProfile's top `n` functions by cumulative time, as text."""
    prof = cProfile.Profile()
    prof.runcall(fn)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(n)
    lines = [ln for ln in out.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return "\n".join(lines[start : start + n + 1])


def run(model: nn.Module, T_values: tuple[int, ...], n_tokens: int = 16) -> str:
    """A text report: op counts per decode step at each T, and cProfile tops of decode and recompress."""
    n_layers = len(model.layers)
    n_kv, d = model.args.num_key_value_heads, model.args.head_dim
    attention.install(model)
    lines = [
        f"decode, {n_layers} layers, {n_tokens} steps after the warm-up step (B0 cache, kvcore attention):"
    ]
    for T in T_values:
        dense = synthetic_cache(n_layers, n_kv, d, T, mx.float32)
        cache = caches.to_sparse_all(dense)
        decode(model, cache, 1)
        with counting(caches) as counts:
            decode(model, cache, n_tokens - 1)
        lines.append(f"  T={T}: kvcore.cache.sparse mx calls over {n_tokens} steps: {dict(counts) or 'none'}")
    dense = synthetic_cache(n_layers, n_kv, d, max(T_values), mx.float32)
    cache = caches.to_sparse_all(dense)
    decode(model, cache, 1)
    lines.append("cProfile of those decode steps (top by own time):")
    lines.append(top(lambda: decode(model, cache, n_tokens - 1)))
    n_q = model.args.num_attention_heads
    T = max(T_values)
    obs = [LayerObservation(c.keys[0, :, :T], mx.zeros((n_q, 1, d)), None, n_q, n_kv, d**-0.5) for c in dense]
    ranking = rank(obs, "knorm")
    with counting(caches) as counts:
        caches.select_positions(dense, select(ranking, 0.25))
    lines.append(f"recompress at T={T}, {n_layers} layers: kvcore.cache.sparse mx calls: {dict(counts)}")
    lines.append("cProfile of one recompress (top by own time):")
    lines.append(top(lambda: caches.select_positions(dense, select(ranking, 0.3))))
    attention.uninstall(model)
    return "\n".join(lines)
