"""Prefill with capture against mlx-lm's plain prefill of the same prompt (items 4, 7).

Plain: the prompt in chunks of 2048 (mlx-lm's `prefill_step_size`), evaluating the cache state after each chunk,
as `generate_step` does. Capture: `prefill_with_capture` with the window Session uses (256 queries), with h2o
deferred (`h2o="lazy"`, what `Session.prefill` runs) and eager (`h2o=True`, the sums computed during prefill).
The lazy sums are then computed on demand once (`ensure_h2o`), reported as the cost of the first h2o request.
"""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from benchmarks.common import Row, judge, peak_mb_of
from kvcore.capture.prefill import prefill_with_capture
from kvcore.model import attention

CHUNK = 2048
WINDOW = 256


def plain_prefill(model: nn.Module, ids: list[int]) -> None:
    cache = make_prompt_cache(model)
    for start in range(0, len(ids), CHUNK):
        logits = model(mx.array([ids[start : start + CHUNK]]), cache=cache)
        mx.eval(logits[:, -1], [c.state for c in cache])


def _timed(fn) -> float:  # noqa: ANN001
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def run(model: nn.Module, name: str, contexts: list[int], rounds: int, eager_h2o: bool) -> list[Row]:
    rows: list[Row] = []
    for T in contexts:
        rows += _at(model, name, T, rounds, eager_h2o)
    attention.uninstall(model)
    return rows


def _at(model: nn.Module, name: str, T: int, rounds: int, eager_h2o: bool) -> list[Row]:
    ids = [(7 * i + 3) % 1000 for i in range(T)]
    attention.uninstall(model)
    plain_prefill(model, ids[:64])  # warm-up
    cases = {
        "mlx-lm plain prefill": lambda: plain_prefill(model, ids),
        "capture (h2o lazy, Session)": lambda: prefill_with_capture(model, ids, window=WINDOW, h2o="lazy"),
        "capture (no h2o)": lambda: prefill_with_capture(model, ids, window=WINDOW, h2o=False),
    }
    best: dict[str, float] = {}
    peaks: dict[str, float] = {}
    for _ in range(rounds):
        for case, fn in cases.items():
            if case.startswith("mlx-lm"):
                attention.uninstall(model)
            ms, peak = peak_mb_of(lambda f=fn: _timed(f))
            best[case] = min(best.get(case, float("inf")), ms)
            peaks[case] = max(peaks.get(case, 0.0), peak)
    base = dict(model=name, context=T, layers=len(model.layers), unit="ms")
    plain = best["mlx-lm plain prefill"]
    rows: list[Row] = []
    for case in cases:
        row = Row(bench="prefill", case=case, value=best[case], peak_mb=peaks[case], **base)
        if not case.startswith("mlx-lm"):
            row.baseline, row.target = plain, "<= 1.10x plain prefill"
            judge(row, best[case] / plain, maximum=1.10)
        rows.append(row)
    result = prefill_with_capture(model, ids, window=WINDOW, h2o="lazy")

    def lazy_h2o() -> None:
        mx.eval([o.ensure_h2o() for o in result.observations if o is not None])

    ms, peak = peak_mb_of(lambda: _timed(lazy_h2o))
    rows.append(Row(bench="prefill", case="first h2o request (ensure_h2o, all layers)", value=ms, peak_mb=peak,
                    note="once per prompt, only when h2o is chosen", **base))  # fmt: skip
    if eager_h2o:
        ms, peak = peak_mb_of(
            lambda: _timed(lambda: prefill_with_capture(model, ids, window=WINDOW, h2o=True))
        )
        row = Row(bench="prefill", case="capture (h2o eager)", value=ms, peak_mb=peak, **base)
        row.baseline, row.target = plain, "<= 1.10x plain prefill"
        row.note = "the seed's path: h2o sums during prefill"
        rows.append(judge(row, ms / plain, maximum=1.10))
    return rows
