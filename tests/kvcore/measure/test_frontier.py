"""Pareto frontier: exactly the brute-force non-dominated subset, in each metric's direction."""

import math
import random

import pytest

from kvcore.measure.frontier import METRICS, metric_value, pareto_front


def brute_force(xs, ys, higher_is_better):
    def better_or_equal(a, b):
        return a >= b if higher_is_better else a <= b

    def strictly_better(a, b):
        return a > b if higher_is_better else a < b

    keep = set()
    for i in range(len(xs)):
        if math.isnan(xs[i]) or math.isnan(ys[i]):
            continue
        dominated = any(
            j != i
            and not (math.isnan(xs[j]) or math.isnan(ys[j]))
            and xs[j] <= xs[i]
            and better_or_equal(ys[j], ys[i])
            and (xs[j] < xs[i] or strictly_better(ys[j], ys[i]))
            for j in range(len(xs))
        )
        if not dominated:
            keep.add(i)
    return keep


@pytest.mark.parametrize("higher", [False, True])
def test_frontier_is_the_non_dominated_subset(higher):
    rng = random.Random(7)
    for trial in range(300):
        n = rng.randint(0, 25)
        # few distinct values so ties in x, in y and whole duplicate points are common
        xs = [float(rng.randint(0, 8)) for _ in range(n)]
        ys = [
            rng.choice([float(rng.randint(0, 6)), math.nan]) if trial % 3 == 0 else rng.random()
            for _ in range(n)
        ]
        front = pareto_front(xs, ys, higher)
        assert set(front) == brute_force(xs, ys, higher), (xs, ys)
        assert len(front) == len(set(front))
        assert [xs[i] for i in front] == sorted(xs[i] for i in front)


def test_metric_directions_and_values():
    assert not METRICS["kl_mean"].higher_is_better and METRICS["kl_mean"].log
    assert METRICS["agreement"].higher_is_better and METRICS["first_divergence"].higher_is_better
    m = {"kl_mean": 0.5, "first_divergence": None, "first_compressed_step": 1, "compared_tokens": 7}
    assert metric_value(m, "kl_mean") == 0.5
    assert metric_value(m, "first_divergence") == 8.0  # never diverged in 8 tokens: best possible
    assert math.isnan(metric_value(m, "needle_recall"))
    with pytest.raises(ValueError, match="unknown metric"):
        metric_value(m, "speed")
