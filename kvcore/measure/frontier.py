"""The memory–quality Pareto frontier of a sweep: fewer bytes and a better metric, in that metric's direction.

A point is on the frontier when no other point has at most its bytes and at least as good a metric, with one of
the two strictly better. Points with no value for the metric (NaN) are never on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_METRIC", "METRICS", "Metric", "PlotWriter", "metric_value", "pareto_front"]

#: Draws a frontier to a PNG/SVG path: (points, path, metric key). The `kvlens` entry point passes the app's Qt
#: writer (app.frontier_export), so kvcore never imports Qt and the file shows what the app shows.
PlotWriter = Callable[[Sequence[Any], Path, str], None]


@dataclass(frozen=True)
class Metric:
    """A quality metric a frontier can be drawn on."""

    key: str
    label: str
    higher_is_better: bool
    log: bool = False  # drawn on a log axis


#: The metrics, in the order the app offers them; the first is the default.
METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        Metric("kl_mean", "KL(dense ‖ compressed), mean per token", higher_is_better=False, log=True),
        Metric("agreement", "Top-1 agreement with dense", higher_is_better=True),
        Metric("nll_delta", "NLL delta (nats per token)", higher_is_better=False),
        Metric("first_divergence", "First divergence (generated token)", higher_is_better=True),
        Metric("needle_recall", "Needle recall", higher_is_better=True),
        Metric("question_accuracy", "Accuracy over questions", higher_is_better=True),
    )
}
DEFAULT_METRIC = next(iter(METRICS))


def metric_value(metrics: Mapping[str, Any], key: str) -> float:
    """The metric as a float, NaN when absent. A continuation that never diverged counts as diverging after its
    last generated token (first_compressed_step + compared_tokens), the best a run of that length can score."""
    if key not in METRICS:
        raise ValueError(f"unknown metric {key!r}; choose one of {', '.join(METRICS)}")
    value = metrics.get(key)
    if key == "first_divergence" and value is None and "compared_tokens" in metrics:
        return float(metrics.get("first_compressed_step", 0) + metrics["compared_tokens"])
    if value is None:
        return math.nan
    return float(value)


def pareto_front(xs: Sequence[float], ys: Sequence[float], higher_is_better: bool) -> list[int]:
    """Indices of the non-dominated points (minimise x; maximise y if `higher_is_better`, else minimise),
    ordered by x. Equal points are all kept; NaN in either coordinate is never on the frontier."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} x values but {len(ys)} y values")
    sign = -1.0 if higher_is_better else 1.0
    valid = [i for i in range(len(xs)) if not (math.isnan(xs[i]) or math.isnan(ys[i]))]
    order = sorted(valid, key=lambda i: (xs[i], sign * ys[i]))
    front: list[int] = []
    best = math.inf  # best (smallest) signed y among points of strictly smaller x
    k = 0
    while k < len(order):
        x = xs[order[k]]
        group = []
        while k < len(order) and xs[order[k]] == x:
            group.append(order[k])
            k += 1
        group_best = sign * ys[group[0]]
        if group_best < best:
            front.extend(i for i in group if sign * ys[i] == group_best)
            best = group_best
    return front
