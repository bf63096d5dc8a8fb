"""A sweep: many compression configurations measured over ONE prefill, each result handed out as it finishes.

The grid is methods × ratios × bits at one group size (and the method parameters of a base config). Every point
is `Session.compress` (a top-n slice, gather and quantize; no forward pass over the prompt) followed by
`Session.regenerate`, so a sweep costs one prefill plus a short decode per point. Cancelling stops between
points or inside a regeneration; the points already finished stay with the caller.

Decoding settings are axes too (`decode_grid`, `run_decode_sweep`): every prefill configuration × every decoding
policy is one greedy decode under that policy, measured against the dense continuation the prefill computed —
once, for every point (no dense token is decoded again).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvcore.defaults import (
    DEFAULT_ANSWER_TOKENS,
    DEFAULT_DECODE_INTERVAL,
    DEFAULT_GROUP_SIZE,
    DEFAULT_N_SINK,
    UNQUANTIZED_BITS,
    bits_or_none,
)
from kvcore.engine.decode_report import DECODE_COLUMNS, decode_summary
from kvcore.engine.decoding import DecodeCancelled, DecodingPolicy, decode_with_policy
from kvcore.engine.questions import Question, accuracy
from kvcore.engine.session import Cancelled, CompressionConfig, Session
from kvcore.measure.export import SUMMARY_COLUMNS

__all__ = [
    "DECODE_SWEEP_COLUMNS",
    "DecodeSweepPoint",
    "SweepPoint",
    "decode_grid",
    "grid",
    "parse_ratios",
    "remaining_seconds",
    "run_decode_sweep",
    "run_sweep",
    "summary_row",
]

#: The most points one ratio range may expand to (a typo such as a step of 0.0001 is refused, not run).
MAX_RANGE_POINTS = 100


@dataclass(frozen=True)
class SweepPoint:
    """One finished configuration: its regenerate metrics, bytes and per-(layer, kv-head) statistics."""

    index: int  # position in the grid
    config: CompressionConfig
    metrics: dict[str, Any]  # Session.regenerate's summary metrics (kl_per_step dropped)
    bytes_dense: int
    bytes_compressed: int
    stats_rows: list[dict[str, Any]]
    seconds: float  # compress + regenerate wall time
    tokens: tuple[int, ...] = ()  # the free-running compressed continuation (recall is scored on it)

    @property
    def percent_of_dense(self) -> float:
        """Compressed bytes as a percentage of the dense cache's."""
        return 100.0 * self.bytes_compressed / self.bytes_dense if self.bytes_dense else math.nan

    def summary(self) -> dict[str, Any]:
        """The SUMMARY_COLUMNS cells of this point (the columns `kvlens sweep` appends to every row)."""
        return summary_row(self.metrics)

    def csv_rows(self) -> list[dict[str, Any]]:
        """This point's rows of a `kvlens sweep` CSV: the statistics rows, each with the summary appended."""
        summary = self.summary()
        return [{**row, **summary} for row in self.stats_rows]


def summary_row(metrics: dict[str, Any]) -> dict[str, Any]:
    """SUMMARY_COLUMNS from a regenerate's metrics."""
    out = {k: metrics.get(k) for k in SUMMARY_COLUMNS}
    out["bytes_dense_total"] = metrics["bytes_dense"]
    out["bytes_compressed_total"] = metrics["bytes_compressed"]
    return out


def parse_ratios(text: str) -> list[float]:
    """Retention ratios from "0.1,0.25,0.5" (a list) or "0.1:0.5:0.1" (start:stop:step, stop included).

    ValueError with the fix on anything else; each ratio must be in (0, 1].
    """
    text = text.strip()
    if not text:
        raise ValueError(
            "no retention ratios given: write a list such as 0.1,0.25,0.5 or a range such as 0.1:0.5:0.1"
        )
    if ":" in text:
        parts = text.split(":")
        try:
            start, stop, step = (float(p) for p in parts)
        except ValueError:
            raise ValueError(f"ratio range {text!r}: write start:stop:step, e.g. 0.1:0.5:0.1") from None
        if step <= 0 or stop < start:
            raise ValueError(f"ratio range {text!r}: the step must be positive and stop at least start")
        n = math.floor((stop - start) / step + 1e-9) + 1
        if n > MAX_RANGE_POINTS:
            raise ValueError(
                f"ratio range {text!r} gives {n} ratios; at most {MAX_RANGE_POINTS}: use a larger step"
            )
        values = [round(start + i * step, 10) for i in range(n)]
    else:
        try:
            values = [float(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise ValueError(
                f"ratios {text!r}: expected comma-separated numbers such as 0.1,0.25,0.5"
            ) from None
    for v in values:
        if not 0.0 < v <= 1.0:
            raise ValueError(
                f"retention ratio {v:g} is outside (0, 1]: a ratio is the fraction of positions kept"
            )
    return list(dict.fromkeys(values))


def grid(
    methods: Sequence[str],
    ratios: Sequence[float],
    bits: Sequence[int | None],
    group_size: int = DEFAULT_GROUP_SIZE,
    base: CompressionConfig | None = None,
) -> list[CompressionConfig]:
    """Every (method, ratio, bits) at `group_size`, method order outermost; bits 16 or None = unquantized.

    Other fields (window, sinks, schedule, …) come from `base`; its `value_bits` applies to the quantized points
    (an 8/4 split base sweeps keys at each width with 4-bit values). ValueError names the first bad value.
    """
    if not methods or not ratios or not bits:
        missing = [n for n, v in (("methods", methods), ("ratios", ratios), ("bits", bits)) if not v]
        raise ValueError(f"a sweep needs at least one value of each: choose {', '.join(missing)}")
    base = base or CompressionConfig()
    return [
        replace(
            base,
            method=m,
            ratio=float(r),
            bits=bits_or_none(b),
            value_bits=None if b in (None, UNQUANTIZED_BITS, base.value_bits) else base.value_bits,
            group_size=group_size,
        )
        for m, r, b in itertools.product(methods, ratios, bits)
    ]


def check_group_size(
    configs: Iterable[CompressionConfig], head_dim: int, value_dim: int | None = None
) -> None:
    """Refuse a quantized config whose group size does not divide the packed widths, before any point runs."""
    for cfg in configs:
        refusal = cfg.group_refusal(head_dim, value_dim) if cfg.quantized else None
        if refusal is not None:
            raise ValueError(refusal)


def run_sweep(
    session: Session,
    configs: Sequence[CompressionConfig],
    should_cancel: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int, SweepPoint], None] | None = None,
    questions: Sequence[Question] = (),
    answer_tokens: int = DEFAULT_ANSWER_TOKENS,
) -> Iterator[SweepPoint]:
    """Compress and regenerate every config over the session's current prefill, yielding each point as it
    finishes. Stops early (without raising) when `should_cancel()` turns true; a point whose regeneration was
    interrupted is dropped, the finished ones have been yielded already.

    With `questions`, the prefill is their context: each point also answers every question from its compressed
    cache (query-agnostic, Session.answer) and its metrics get `question_accuracy` (None when no question has an
    expected answer)."""
    if not session.prompt_ids:
        raise ValueError("no prompt has been prefilled yet: run Prefill first")
    check_group_size(configs, session.info.head_dim, session.info.value_dim)
    cancelled = should_cancel or (lambda: False)
    for i, cfg in enumerate(configs):
        if cancelled():
            return
        start = time.perf_counter()
        state = session.compress(cfg)
        try:
            regen = session.regenerate(state, should_cancel=cancelled)
        except Cancelled:
            return
        summary = {k: v for k, v in regen.metrics.items() if k != "kl_per_step"}
        if questions:
            answers = []
            for question in questions:
                if cancelled():
                    return
                answers.append(session.answer(state, question, answer_tokens))
            summary["question_accuracy"] = accuracy(answers, compressed=True)
        point = SweepPoint(
            index=i,
            config=cfg,
            metrics=summary,
            bytes_dense=state.bytes_dense,
            bytes_compressed=state.bytes_compressed,
            stats_rows=[dict(r) for r in state.stats_rows],
            seconds=time.perf_counter() - start,
            tokens=tuple(regen.tokens),
        )
        if on_progress is not None:
            on_progress(i + 1, len(configs), point)
        yield point


def remaining_seconds(points: Sequence[SweepPoint], total: int) -> float | None:
    """Estimated seconds left: the mean time of the finished points times the points still to run (None before
    the first point)."""
    if not points:
        return None
    return sum(p.seconds for p in points) / len(points) * max(total - len(points), 0)


#: A decoding sweep's CSV: the prefill configuration, then the decoding run's summary.
DECODE_SWEEP_COLUMNS: tuple[str, ...] = (
    "method",
    "ratio",
    "key_bits",
    "value_bits",
    *DECODE_COLUMNS,
    "beyond_context",
    "seconds",
)


@dataclass(frozen=True)
class DecodeSweepPoint:
    """One (prefill configuration, decoding policy): the decoding run's summary against the dense continuation."""

    index: int
    config: CompressionConfig
    policy: DecodingPolicy
    metrics: dict[str, Any]  # kvcore.engine.decode_report.decode_summary
    seconds: float  # compress + decode wall time

    def row(self) -> dict[str, Any]:
        """This point's DECODE_SWEEP_COLUMNS."""
        described = self.config.describe()
        head = {k: described[k] for k in ("method", "ratio", "key_bits", "value_bits")}
        return {**head, **self.metrics, "seconds": self.seconds}


def decode_grid(
    methods: Sequence[str],
    budgets: Sequence[int],
    interval: int = DEFAULT_DECODE_INTERVAL,
    n_sink: int = DEFAULT_N_SINK,
) -> list[DecodingPolicy]:
    """Every (decoding method, budget), method order outermost; ValueError names the first bad one."""
    if not methods or not budgets:
        raise ValueError("a decoding sweep needs at least one decoding method and one budget")
    return [DecodingPolicy(m, b, interval, n_sink) for m, b in itertools.product(methods, budgets)]


def run_decode_sweep(
    session: Session,
    configs: Sequence[CompressionConfig],
    policies: Sequence[DecodingPolicy],
    n: int,
    should_cancel: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int, DecodeSweepPoint], None] | None = None,
) -> Iterator[DecodeSweepPoint]:
    """Every config × policy over the session's prefill: compress once per config, then decode n tokens under each
    policy from that state, yielding each point as it finishes; stops early (without raising) on a cancel."""
    if not session.dense_tokens:
        raise ValueError("no prefill: prefill a prompt before a decoding sweep")
    cancelled = should_cancel or (lambda: False)
    total = len(configs) * len(policies)
    for c, cfg in enumerate(configs):
        if cancelled():
            return
        start = time.perf_counter()
        state = session.compress(cfg)
        compress_seconds = time.perf_counter() - start
        for p, policy in enumerate(policies):
            start = time.perf_counter()
            try:
                run = decode_with_policy(session, state, policy, n, should_cancel=cancelled)
            except DecodeCancelled:
                return
            index = c * len(policies) + p
            seconds = time.perf_counter() - start + (compress_seconds if p == 0 else 0.0)
            summary = {**decode_summary(session, run), "beyond_context": session.beyond_context}
            point = DecodeSweepPoint(index, cfg, policy, summary, seconds)
            if on_progress is not None:
                on_progress(index + 1, total, point)
            yield point
