"""Decode tokens/s: kvcore's caches against mlx-lm's own, in the same manual greedy loop (items 1, 2, 3, 7).

Both sides run the loop of `mlx_lm.generate_step` without its async prefetch: `model(tok, cache)`, argmax,
`mx.eval`, one token at a time. mlx-lm's cases run with the model's stock attention function; kvcore's with
`kvcore.model.attention.sdpa` installed, as the app runs them. Every case starts from a fresh branch of the same dense
cache, decodes one warm-up token (which is where both sides copy the shared buffer once), then `n_tokens` timed
ones. Cases are interleaved round by round and the best round is reported: other processes share this 2-core
CPU, and interference only ever slows a round down.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from benchmarks.common import Row, judge, peak_mb_of, shape_of, synthetic_cache
from kvcore.cache import sparse as caches
from kvcore.model import attention

Factory = Callable[[], list[Any]]


@contextmanager
def attention_for(model: nn.Module, kvcore_side: bool):
    """kvcore's attention for kvcore's caches, the model's stock one for mlx-lm's."""
    if kvcore_side:
        attention.install(model)
    else:
        attention.uninstall(model)
    try:
        yield
    finally:
        attention.uninstall(model)


def decode(model: nn.Module, cache: list[Any], n_tokens: int) -> float:
    """Tokens/s over n_tokens greedy steps after one warm-up step (the same loop for every cache)."""
    tok = mx.array([[1]])

    def step(t: mx.array) -> mx.array:
        logits = model(t, cache=cache)
        out = mx.argmax(logits[:, -1], axis=-1, keepdims=True)
        mx.eval(out)
        return out

    tok = step(tok)
    start = time.perf_counter()
    for _ in range(n_tokens):
        tok = step(tok)
    return n_tokens / (time.perf_counter() - start)


def random_selection(n_layers: int, n_heads: int, T: int, ratio: float, seed: int = 0) -> list[np.ndarray]:
    """Per layer [H_kv, n] sorted positions; which positions are kept does not change decode cost."""
    rng = np.random.default_rng(seed)
    n = max(1, round(ratio * T))
    return [
        np.sort(np.stack([rng.choice(T, n, replace=False) for _ in range(n_heads)]), axis=1).astype(np.int32)
        for _ in range(n_layers)
    ]


def cases_for(dense: list[Any], T: int, ratios: list[float]) -> dict[str, tuple[bool, Factory]]:
    """name -> (kvcore side?, fresh cache factory); each factory branches the same dense cache."""
    n_layers, n_heads = len(dense), dense[0].keys.shape[1]
    out: dict[str, tuple[bool, Factory]] = {
        "mlx-lm KVCache": (False, lambda: caches.copy_cache(dense)),
        "kvcore B0": (True, lambda: caches.to_sparse_all(dense)),
    }
    for bits in (4, 8):
        out[f"mlx-lm QuantizedKVCache {bits}b"] = (
            False,
            lambda b=bits: [c.to_quantized(group_size=64, bits=b) for c in dense],
        )
        out[f"kvcore quantize_cache {bits}b"] = (
            True,
            lambda b=bits: caches.quantize_cache(dense, bits=b, group_size=64),
        )
    for r in ratios:
        sel = random_selection(n_layers, n_heads, T, r)
        out[f"kvcore {int(r * 100)}% kept"] = (True, lambda s=sel: caches.select_positions(dense, s))
    return out


def run(
    model: nn.Module, name: str, contexts: list[int], n_tokens: int, rounds: int, ratio_contexts: list[int]
) -> list[Row]:
    """All decode cases of one model at each context; rows for items 1, 2, 3 with peak memory (item 7)."""
    n_layers, n_heads, head_dim = shape_of(model)
    dtype = model.layers[0].self_attn.q_proj.weight.dtype
    rows: list[Row] = []
    for T in contexts:
        dense = synthetic_cache(n_layers, n_heads, head_dim, T, dtype)
        cases = cases_for(dense, T, [0.1, 0.25, 0.5] if T in ratio_contexts else [])
        tps: dict[str, list[float]] = {c: [] for c in cases}
        peaks: dict[str, float] = {}
        nbytes: dict[str, int] = {}
        for _ in range(rounds):
            for case, (kv_side, factory) in cases.items():
                with attention_for(model, kv_side):

                    def one(f: Factory = factory) -> tuple[float, int]:
                        cache = f()
                        size = caches.cache_tensor_bytes(cache)
                        return decode(model, cache, n_tokens), size

                    (speed, size), peak = peak_mb_of(one)
                tps[case].append(speed)
                peaks[case] = max(peaks.get(case, 0.0), peak)
                nbytes[case] = size
        med = {c: max(v) for c, v in tps.items()}
        base = dict(model=name, context=T, layers=n_layers, unit="tok/s")
        dense_bytes = caches.cache_tensor_bytes(dense)
        for case in cases:
            row = Row(bench="decode", case=case, value=med[case], peak_mb=peaks[case], **base)
            row.extra = {"cache_bytes": nbytes[case]}
            if case == "kvcore B0":
                row.baseline = med["mlx-lm KVCache"]
                row.target = ">= 0.97x mlx-lm KVCache"
                judge(row, med[case] / row.baseline, minimum=0.97)
            elif case.startswith("kvcore quantize_cache"):
                bits = case.split()[-1]
                row.baseline = med[f"mlx-lm QuantizedKVCache {bits}"]
                row.target = f">= 0.97x mlx-lm QuantizedKVCache {bits}"
                judge(row, med[case] / row.baseline, minimum=0.97)
            elif case.endswith("kept"):
                r = int(case.split()[1].rstrip("%")) / 100
                n = max(1, round(r * T))
                exact = nbytes[case] * T == dense_bytes * n
                row.baseline = med["kvcore B0"]
                row.target = "faster than dense; bytes = n/T x dense"
                judge(row, med[case] / row.baseline, minimum=1.0)
                row.note = (
                    f"bytes {nbytes[case] / dense_bytes:.4f} x dense ({'exact' if exact else 'NOT exact'})"
                )
                if not exact:
                    row.ok = "NO"
            rows.append(row)
        del dense
    return rows
