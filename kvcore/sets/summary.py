"""Per-configuration summary of a prompt-set run: mean and a seeded percentile-bootstrap interval over prompts.

It reads the rows as the results CSV holds them (text cells), so a fresh, a resumed and a distributed run of the
same work summarise the same bytes to the same numbers. Each (configuration, metric) resamples with a generator
seeded afresh, so one configuration's interval does not depend on which others ran.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvcore.defaults import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE, MIN_PROMPTS_FOR_INTERVAL
from kvcore.measure.export import CONFIG_COLUMNS, SET_METRICS


def bootstrap_interval(
    values: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> tuple[float, float, float]:
    """(mean, low, high): the mean and the central `confidence` percentile interval of resampled means.

    Non-finite values are dropped; none left gives NaNs, one value an interval of zero width.
    """
    v = np.array([x for x in values if math.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    if v.size == 1:
        return mean, mean, mean
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(resamples, v.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return mean, float(low), float(high)


def few_prompts(n: int) -> bool:
    """Whether an interval over `n` prompts is marked: too few for the bootstrap to be more than their min–max."""
    return n < MIN_PROMPTS_FOR_INTERVAL


def few_prompts_note(n: int) -> str:
    """What a summary printed or drawn says beside such an interval; empty when there are enough prompts."""
    return f"(n < {MIN_PROMPTS_FOR_INTERVAL}: min–max of few prompts)" if few_prompts(n) else ""


def _number(cell: Any) -> float | None:
    if cell is None or cell == "":
        return None
    try:
        return float(cell)
    except (TypeError, ValueError):
        return None


def summary_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row of SET_SUMMARY_COLUMNS per configuration, in order of first appearance.

    A prompt's value for a configuration is taken once (a sweep repeats it on every (layer, kv-head) row).
    """
    groups: dict[tuple, dict[str, Mapping[str, Any]]] = {}
    for row in rows:
        key = tuple(row.get(c, "") for c in CONFIG_COLUMNS)
        groups.setdefault(key, {}).setdefault(str(row["prompt"]), row)
    out = []
    for key, per_prompt in groups.items():
        summary: dict[str, Any] = dict(zip(CONFIG_COLUMNS, key, strict=True))
        summary["prompts"] = len(per_prompt)
        for name, column in SET_METRICS.items():
            values = [_number(r.get(column)) for r in per_prompt.values()]
            present = [v for v in values if v is not None]
            stats = bootstrap_interval(present) if present else (None, None, None)
            for part, value in zip(("mean", "low", "high"), stats, strict=True):
                summary[f"{name}_{part}"] = None if value is None or math.isnan(value) else value
        summary["few_prompts"] = few_prompts(len(per_prompt))
        out.append(summary)
    return out


def summary_paths(csv_path: Path) -> tuple[Path, Path]:
    """Where the per-configuration summary goes: beside the results, `<stem>.summary.csv` and `.summary.json`."""
    return csv_path.with_suffix(".summary.csv"), csv_path.with_suffix(".summary.json")


def summary_json(summary: list[dict[str, Any]]) -> dict[str, Any]:
    """The `.summary.json` document: the bootstrap's settings and each configuration's row, its text cells typed
    (an empty cell as null, numbers as numbers)."""

    def typed(v: Any) -> Any:
        if v == "":
            return None
        if isinstance(v, str):
            for kind in (int, float):
                try:
                    return kind(v)
                except ValueError:
                    pass
        return v

    return {
        "confidence": CONFIDENCE,
        "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
        "bootstrap_seed": BOOTSTRAP_SEED,
        "configurations": [{k: typed(v) for k, v in row.items()} for row in summary],
    }
