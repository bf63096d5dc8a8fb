"""Evaluate needle probes on a Session: one prefill per probe, every configuration recompressed from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvcore.defaults import UNQUANTIZED_BITS
from kvcore.probes.base import Probe, recalls

#: Columns of `kvlens probe --csv` (and of the app's needle grid export), in this order.
PROBE_COLUMNS: tuple[str, ...] = (
    "family",
    "seed",
    "depth",
    "n_tokens",
    "prompt_tokens",
    "method",
    "schedule",
    "retention_ratio",
    "key_bits",
    "value_bits",
    "fp_recent",
    "group_size",
    "per_head",
    "recalled",
    "answer",
    "continuation",
    "compression_ratio",
)

#: `kvlens probe --prompts`: which prompt (file name or JSONL id), then the probe columns (family, seed, depth and
#: n_tokens empty: the prompt is the user's, not generated).
PROMPT_PROBE_COLUMNS: tuple[str, ...] = ("prompt", *PROBE_COLUMNS)

#: The `method` of the row that uses the dense cache (the baseline every probe is also scored on).
DENSE = "dense"

#: The `method` of the control row: the dense cache on the prompt without its needle (`Probe.control_prompt`).
CONTROL = "no_needle"


def _row(probe: Probe, prompt_tokens: int, text: str, **config: Any) -> dict[str, Any]:
    return {
        "family": probe.family,
        "seed": probe.seed,
        "depth": probe.depth,
        "n_tokens": probe.n_tokens,
        "prompt_tokens": prompt_tokens,
        **config,
        "recalled": recalls(probe, text),
        "answer": probe.answer,
        "continuation": text,
    }


def probe_rows(
    session: Any,
    probe: Probe,
    configs: Sequence[Any],
    should_cancel: Callable[[], bool] | None = None,
    include_dense: bool = True,
    control: bool = False,
) -> list[dict[str, Any]]:
    """Prefill `probe` once; a row for the dense cache (optional) and one per CompressionConfig; with `control`,
    a second prefill of the prompt without its needle and its row (last, so the configurations share the first)."""
    session.prefill(probe.prompt, n_tokens=probe.max_new_tokens, should_cancel=should_cancel)
    rows = [dense_row(session, probe)] if include_dense else []
    rows += config_rows(session, probe, configs, should_cancel)
    if control:
        session.prefill(probe.control_prompt, n_tokens=probe.max_new_tokens, should_cancel=should_cancel)
        rows.append(dense_row(session, probe, method=CONTROL))
    return rows


def dense_row(session: Any, probe: Probe, method: str = DENSE) -> dict[str, Any]:
    """The dense cache's row on the probe the session has prefilled (`method` CONTROL: its control prompt)."""
    text = session.tokenizer.decode(session.dense_tokens[: probe.max_new_tokens])
    return _row(
        probe,
        len(session.prompt_ids),
        text,
        method=method,
        schedule="",
        retention_ratio=1.0,
        key_bits=UNQUANTIZED_BITS,
        value_bits=UNQUANTIZED_BITS,
        fp_recent=0,
        group_size="",
        per_head="",
        compression_ratio=1.0,
    )


def config_rows(
    session: Any, probe: Probe, configs: Sequence[Any], should_cancel: Callable[[], bool] | None = None
) -> list[dict[str, Any]]:
    """One row per configuration, recompressed from the probe the session has prefilled (no forward pass)."""
    rows = []
    for cfg in configs:
        state = session.compress(cfg)
        text = session.tokenizer.decode(session.continuation(state, probe.max_new_tokens, should_cancel))
        rows.append(
            _row(
                probe,
                len(session.prompt_ids),
                text,
                method=cfg.method,
                schedule=cfg.schedule,
                retention_ratio=cfg.ratio,
                key_bits=cfg.widths[0],
                value_bits=cfg.widths[1],
                fp_recent=cfg.fp_recent,
                group_size=cfg.group_size,
                per_head=cfg.per_head,
                compression_ratio=state.bytes_compressed / state.bytes_dense if state.bytes_dense else 1.0,
            )
        )
    return rows


def question_rows(
    session: Any, probe: Probe, feed: str, configs: Sequence[Any | None], schedule: str
) -> list[dict[str, Any]]:
    """Query-agnostic: `feed` (the question, and the chat template's tail) appended to copies of the prefilled
    context's caches, dense for None, else compressed by the configuration; one row each, recall on the answer."""
    rows = []
    for cfg in configs:
        state = None if cfg is None else session.compress(cfg)
        sched = schedule if cfg is None else cfg.schedule
        text = session.tokenizer.decode(session.answer_tokens(state, feed, probe.max_new_tokens, sched))
        if state is None:
            rows.append({**dense_row(session, probe), "recalled": recalls(probe, text), "continuation": text})
            continue
        rows.append(
            _row(
                probe,
                len(session.prompt_ids),
                text,
                method=cfg.method,
                schedule=cfg.schedule,
                retention_ratio=cfg.ratio,
                key_bits=cfg.widths[0],
                value_bits=cfg.widths[1],
                fp_recent=cfg.fp_recent,
                group_size=cfg.group_size,
                per_head=cfg.per_head,
                compression_ratio=state.bytes_compressed / state.bytes_dense if state.bytes_dense else 1.0,
            )
        )
    return rows


def recall_table(rows: Sequence[dict[str, Any]]) -> dict[tuple, float]:
    """Recall per (method, schedule, retention_ratio, key_bits, value_bits, fp_recent): the share of probes recalled."""
    groups: dict[tuple, list[bool]] = {}
    for r in rows:
        key = (
            r["method"],
            r["schedule"],
            r["retention_ratio"],
            r["key_bits"],
            r["value_bits"],
            r["fp_recent"],
        )
        groups.setdefault(key, []).append(bool(r["recalled"]))
    return {k: sum(v) / len(v) for k, v in groups.items()}
