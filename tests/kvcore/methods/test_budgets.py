"""Budgets: n = round(r·T), the PyramidKV pyramid and its fallback, AdaKV's fixed layer total."""

import math

import numpy as np
import pytest

from kvcore.methods import budgets


@pytest.mark.parametrize(
    ("n_tokens", "ratio", "n"),
    # kvpress's int(T·(1 − c)), c = 1 − r, float artifacts included: 1 − 0.9 = 0.09999999999999998.
    [(100, 0.25, 25), (10, 0.25, 2), (10, 0.01, 1), (7, 1.0, 7), (780, 0.1, 77), (781, 0.5, 390)],
)
def test_n_kept_is_kvpress_budget_and_at_least_one(n_tokens, ratio, n):
    assert budgets.n_kept(n_tokens, ratio) == n
    assert budgets.uniform(n_tokens, ratio, 3) == [n] * 3


@pytest.mark.parametrize("ratio", [0, -0.1, 1.01, float("nan"), "half"])
def test_ratio_outside_unit_interval_is_refused(ratio):
    with pytest.raises(ValueError, match=r"ratio must be .*\(0, 1\].*got"):
        budgets.n_kept(100, ratio)


@pytest.mark.parametrize(
    ("n_tokens", "ratio", "n_layers", "window"), [(4096, 0.5, 16, 64), (1000, 0.3, 5, 8), (3000, 0.3, 28, 32)]
)
def test_pyramidkv_counts_are_a_pyramid_that_averages_n(n_tokens, ratio, n_layers, window):
    """The paper's shape, not its formula: lower layers keep more, in equal steps (up to rounding), the
    top layer keeps 1/beta of n, and the model-wide total is the uniform rule's."""
    n = budgets.n_kept(n_tokens, ratio)
    got = budgets.pyramidkv(n_tokens, ratio, n_layers, window)
    assert got.fallback is None
    steps = np.diff(got.counts)
    assert (steps < 0).all() and steps.max() - steps.min() <= 1
    assert abs(got.counts[-1] - n / 20) <= 0.5
    assert abs(sum(got.counts) - n_layers * n) <= n_layers / 2
    assert window <= got.counts[-1] and got.counts[0] <= n_tokens


@pytest.mark.parametrize(
    ("n_tokens", "ratio", "n_layers", "window", "beta", "counts"),
    [
        # by hand: n = 400, min = n/beta = 20, max = 2n - min = 780, step (780 - 20)/4 = 190
        (1000, 0.4, 5, 8, 20, [780, 590, 400, 210, 20]),
        # n = 100, min = 10, max = 190, step 60
        (200, 0.5, 4, 4, 10, [190, 130, 70, 10]),
    ],
)
def test_pyramidkv_counts_hand_computed(n_tokens, ratio, n_layers, window, beta, counts):
    got = budgets.pyramidkv(n_tokens, ratio, n_layers, window, beta=beta)
    assert (got.counts, got.fallback) == (counts, None)


def test_pyramidkv_keeps_kvpress_published_counts():
    """kvpress 0.5.5's PyramidKVPress at compression 0.5 on a 780-position prompt, 8 layers, window 64."""
    got = budgets.pyramidkv(780, 0.5, 8, 64)
    assert (got.counts, got.fallback) == ([716, 623, 530, 437, 343, 250, 157, 64], None)


@pytest.mark.parametrize("n_tokens", [700, 780, 1500, 2000])
@pytest.mark.parametrize("ratio", [0.5, 0.6, 0.8, 0.9])
@pytest.mark.parametrize("n_layers", [4, 8, 32])
def test_pyramidkv_capped_pyramid_is_real_at_high_ratios(n_tokens, ratio, n_layers):
    """Where the uncapped max 2n - n/beta would exceed T - w, the cap keeps a pyramid instead of falling back:
    the lowest layer keeps everything outside the window, the top at least the window, counts strictly
    decrease in equal steps (strictly at r = 0.5), and the total stays the uniform rule's."""
    window = 64
    n = ratio * n_tokens
    assert 2 * n - n / 20 >= n_tokens - window  # the cap applies here
    got = budgets.pyramidkv(n_tokens, ratio, n_layers, window)
    assert got.fallback is None
    steps = np.diff(got.counts)
    assert (steps <= 0).all() and steps.max() - steps.min() <= 1 and got.counts[0] > got.counts[-1]
    if ratio == 0.5:
        assert (steps < 0).all()
    assert got.counts[0] == n_tokens - window and got.counts[-1] >= window
    assert abs(sum(got.counts) - n_layers * n) <= n_layers / 2


@pytest.mark.parametrize(
    ("n_tokens", "ratio", "n_layers", "why"),
    [
        (4096, 0.25, 16, "min=51.2"),  # the top layer could not hold its window
        (100, 0.9, 4, "max=36 (capped"),  # even capped, the prompt is too short for a window of 64
        (4096, 0.5, 1, "single layer"),
    ],
)
def test_pyramidkv_falls_back_to_uniform(n_tokens, ratio, n_layers, why):
    got = budgets.pyramidkv(n_tokens, ratio, n_layers)
    assert got.counts == budgets.uniform(n_tokens, ratio, n_layers)
    assert why in got.fallback


@pytest.mark.parametrize("seed", range(5))
def test_adakv_total_fixed_and_every_head_safeguarded(seed):
    rng = np.random.default_rng(seed)
    n_heads, n_tokens = int(rng.integers(1, 9)), int(rng.integers(5, 300))
    priority = -np.sort(-(rng.random((n_heads, n_tokens)) ** rng.uniform(0.2, 5, (n_heads, 1))), axis=1)
    flat_order = np.argsort(-priority.ravel(), kind="stable")
    for ratio in (0.05, 0.2, 0.5, 1.0):
        n = budgets.n_kept(n_tokens, ratio)
        counts = budgets.adakv_counts(flat_order, n_tokens, n_heads, n, alpha=0.2)
        assert counts.sum() == n_heads * n
        assert counts.min() >= max(1, math.floor(0.2 * n)) and counts.max() <= n_tokens


def test_adakv_keeps_a_position_in_every_head_below_one_over_alpha():
    """n = 1 or 2 per head at α = 0.2: the paper's floor ⌊α·n⌋ is 0 and the head the others outrank kept
    nothing (an empty selection the cache refuses; found by the random-actions GUI test)."""
    n_heads, n_tokens = 2, 40
    priority = np.stack([np.linspace(1.0, 0.9, n_tokens), np.linspace(0.5, 0.0, n_tokens)])
    flat_order = np.argsort(-priority.ravel(), kind="stable")
    for n in (1, 2, 4):
        counts = budgets.adakv_counts(flat_order, n_tokens, n_heads, n, alpha=0.2)
        assert counts.tolist() == [2 * n - 1, 1]
