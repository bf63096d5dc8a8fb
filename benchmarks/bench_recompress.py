"""Recompress latency (slider move -> compressed cache ready) against one plain copy of the dense cache (5, 7).

What is timed is exactly what `Session.compress` reports as `recompress_ms`: the cached ranking sliced at a new
ratio (`selection.select`) and `select_positions` (every layer's gather in one evaluation) — from the dense cache,
or for a quantized config from the dense cache packed once per bit width (what Session does now). The old quantized
path (gather, then `quantize_cache` of the kept rows) and the one-time packing are reported next to it. The floor is one plain copy of every layer's K and V (`mx.array` of the dense rows). The fp
rows also time the per-layer path of before issue 15 (`benchmarks.select_positions_before`) in the same run. The
caches are bf16 with the real models' shapes (all layers); the ranking (knorm) is computed once beforehand, as the
Session caches it per method.
"""

from __future__ import annotations

import mlx.core as mx

from benchmarks import select_positions_before
from benchmarks.common import Row, best_ms, judge, peak_mb_of, synthetic_cache
from kvcore.cache import sparse as caches
from kvcore.capture.prefill import LayerObservation
from kvcore.methods.selection import rank, select

SHAPES = {"llama-3.2-1b": (16, 32, 8, 64), "qwen3-0.6b": (28, 16, 8, 128)}  # layers, H_q, H_kv, head_dim


def _observations(dense: list, n_q: int, T: int) -> list[LayerObservation]:
    n_kv, d = dense[0].keys.shape[1], dense[0].keys.shape[3]
    q = mx.zeros((n_q, 1, d))
    return [LayerObservation(c.keys[0, :, :T], q, None, n_q, n_kv, d**-0.5) for c in dense]


def run(name: str, contexts: list[int], repeats: int, ratio: float = 0.25) -> list[Row]:
    rows: list[Row] = []
    for T in contexts:
        rows += _at(name, T, repeats, ratio)
    return rows


def _at(name: str, T: int, repeats: int, ratio: float) -> list[Row]:
    """The rows of one context length (the caches are freed when this returns)."""
    n_layers, n_q, n_kv, d = SHAPES[name]
    dense = synthetic_cache(n_layers, n_kv, d, T, mx.bfloat16)
    ranking = rank(_observations(dense, n_q, T), "knorm")
    select(ranking, 0.5)

    def copy() -> None:
        mx.eval([mx.array(x[..., :T, :]) for c in dense for x in (c.keys, c.values)])

    def fp() -> None:
        caches.select_positions(dense, select(ranking, ratio), validate=False)

    def q4_old() -> None:
        caches.quantize_cache(caches.select_positions(dense, select(ranking, ratio)), bits=4, group_size=64)

    def fp_checked() -> None:
        caches.select_positions(dense, select(ranking, ratio))

    def fp_before() -> None:
        select_positions_before.select_positions(dense, select(ranking, ratio), validate=False)

    def fp_checked_before() -> None:
        select_positions_before.select_positions(dense, select(ranking, ratio))

    def pack() -> list:
        return caches.quantize_cache(dense, bits=4, group_size=64)

    packed = pack()

    def q4() -> None:
        caches.select_positions(packed, select(ranking, ratio), validate=False)

    base = dict(model=name + " (bf16 cache)", context=T, layers=n_layers, unit="ms")
    rows: list[Row] = []
    copy_ms, copy_peak = peak_mb_of(lambda: best_ms(copy, repeats))
    rows.append(Row(bench="recompress", case="one plain copy of the dense cache", value=copy_ms,
                    peak_mb=copy_peak, **base))  # fmt: skip
    pct = int(ratio * 100)
    cases = (
        (f"select {pct}% + gather (Session: trusted indices)", fp),
        (f"select {pct}% + gather, indices checked", fp_checked),
        (f"select {pct}% + gather of 4-bit packed (Session)", q4),
        (f"select {pct}% + gather + quantize 4-bit (before)", q4_old),
    )
    before = {cases[0][0]: fp_before, cases[1][0]: fp_checked_before}
    for case, fn in cases:
        ms, peak = peak_mb_of(lambda f=fn: best_ms(f, repeats))
        row = Row(bench="recompress", case=case, value=ms, peak_mb=peak, baseline=copy_ms,
                  target="<= 2x one plain copy", **base)  # fmt: skip
        row.extra = {"ms_per_1k_tokens": ms / T * 1000}
        if case in before:  # the per-layer path of before issue 15, measured in the same run
            old_ms = best_ms(before[case], repeats)
            row.extra.update(before_ms=old_ms, x_before=ms / old_ms)
            row.note = f"per-layer path before: {old_ms:.2f} ms ({ms / old_ms:.2f}x)"
        rows.append(judge(row, ms / copy_ms, maximum=2.0))
    ms, peak = peak_mb_of(lambda: best_ms(pack, repeats))
    rows.append(Row(bench="recompress", case="pack dense cache 4-bit (once per bit width)", value=ms,
                    peak_mb=peak, note="first quantized config at a new bit width", **base))  # fmt: skip
    return rows
