"""The leaderboard table: one row per method, one column per compression ratio (the mean over tasks) and one per
(task, ratio); scores are RULER's, in percent, as kvpress's leaderboard shows them.

kvpress's `compression_ratio` is 1 − retention: 0.25 keeps three quarters of the context.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: The columns that say which run a row belongs to (a resumed file must match them).
RUN_COLUMNS: tuple[str, ...] = ("model", "mode", "haystack", "length", "samples", "schedule")
#: The row of the dense cache (no compression: the same score in every ratio column).
DENSE = "dense"


def ratio_column(ratio: float) -> str:
    return f"{ratio:g}"


def task_column(task: str, ratio: float) -> str:
    return f"{task}@{ratio:g}"


def columns(ratios: Sequence[float], tasks: Sequence[str]) -> tuple[str, ...]:
    """method, the run's columns, the mean per ratio, then each task per ratio."""
    per_task = [task_column(t, r) for t in tasks for r in ratios]
    return ("method", *RUN_COLUMNS, *(ratio_column(r) for r in ratios), *per_task)


def row(
    method: str,
    run: Mapping[str, Any],
    scores: Mapping[float, Mapping[str, Sequence[float]]],
    ratios: Sequence[float],
    tasks: Sequence[str],
) -> dict[str, Any]:
    """One method's row from its per-sample scores (ratio -> task -> scores in [0, 1]): means in percent, the
    ratio's column the mean over tasks (each task weighted alike, as RULER and kvpress average)."""
    out: dict[str, Any] = {"method": method, **run}
    for r in ratios:
        means = [100 * sum(scores[r][t]) / len(scores[r][t]) for t in tasks]
        out[ratio_column(r)] = round(sum(means) / len(means), 2)
        for t, m in zip(tasks, means, strict=True):
            out[task_column(t, r)] = round(m, 2)
    return out


def text_table(rows: Sequence[Mapping[str, Any]], ratios: Sequence[float]) -> str:
    """The mean-over-tasks columns as aligned text, one line per method (what the CLI prints)."""
    width = max([len("method"), *(len(str(r["method"])) for r in rows)])
    head = "method".ljust(width) + "".join(f"{ratio_column(r):>9}" for r in ratios)
    lines = [head]
    for r in rows:
        lines.append(
            str(r["method"]).ljust(width) + "".join(f"{float(r[ratio_column(x)]):>9.2f}" for x in ratios)
        )
    return "\n".join(lines)
