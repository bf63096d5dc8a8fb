"""How many positions each layer and kv-head keeps: uniform, per layer (pyramidkv) and per head (adakv)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvcore.defaults import ADAKV_ALPHA, DEFAULT_WINDOW, PYRAMIDKV_BETA


def check_ratio(ratio: float) -> float:
    """The retention ratio as a float in (0, 1]; ValueError otherwise."""
    try:
        value = float(ratio)
    except (TypeError, ValueError):
        raise ValueError(f"ratio must be a number in (0, 1], got {ratio!r}") from None
    if not 0.0 < value <= 1.0:
        raise ValueError(f"ratio must be in (0, 1] (fraction of prompt positions kept), got {ratio!r}")
    return value


def n_kept(n_tokens: int, ratio: float) -> int:
    """kvpress's budget, at least 1: int(T·(1 − c)) with its compression ratio c = 1 − r, computed as kvpress
    computes it (so r = 0.1 on T = 780 keeps int(780 · 0.09999999999999998) = 77), which parity with kvpress needs."""
    return max(1, int(n_tokens * (1 - (1 - check_ratio(ratio)))))


def uniform(n_tokens: int, ratio: float, n_layers: int) -> list[int]:
    """The same n for every layer."""
    return [n_kept(n_tokens, ratio)] * n_layers


@dataclass(frozen=True)
class PyramidBudget:
    counts: list[int]  # per layer, per kv-head
    fallback: str | None  # why the uniform rule was used instead, or None


def pyramidkv(
    n_tokens: int, ratio: float, n_layers: int, window: int = DEFAULT_WINDOW, beta: float = PYRAMIDKV_BETA
) -> PyramidBudget:
    """PyramidKV's per-layer budgets as the authors' code (KVCache-Factory) and kvpress compute them.

    With C - w = r·T (unrounded, in kvpress's floating-point steps): min = (C - w)/beta, max = 2(C - w) - min; when max reaches T - w
    the pyramid is capped (max = T - w, min = 2(C - w) - max) so the lowest layer never needs more than the
    prompt outside the window. Layer l keeps round(max - l·(max - min)/(L - 1)); the budgets average r·T, so the
    model-wide total matches the uniform rule. Without the cap the rule is infeasible at every r >= ~0.5 and
    pyramidkv silently becomes snapkv. Infeasible (-> uniform n, with the reason) only when
    T >= max >= min >= w fails (then snapkv's round(r·T), as kvpress), or there is a single layer.
    """
    if window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    # kvpress falls back to snapkv's budget rounded half to even (Python's round), not floored as n_kept is.
    n = max(1, round(n_tokens * (1 - (1 - check_ratio(ratio)))))
    if n_layers < 2:
        return PyramidBudget([n] * n_layers, "a single layer has no pyramid")
    capacity = window + n_tokens * (1 - (1 - ratio))  # C, in kvpress's floating-point steps
    budget = capacity - window  # C - w
    low = budget / beta
    high = 2 * budget - low
    capped = high >= n_tokens - window
    if capped:
        high = n_tokens - window
        low = 2 * budget - high
    if not n_tokens >= high >= low >= window:
        cap = f" (capped at T - window = {n_tokens - window})" if capped else ""
        why = (
            f"pyramid needs T >= max >= min >= window: T={n_tokens}, max={high:g}{cap}, min={low:g}, "
            f"window={window}; every layer keeps the uniform {n}"
        )
        return PyramidBudget([n] * n_layers, why)
    step = (high - low) / (n_layers - 1)
    return PyramidBudget([round(high - layer * step) for layer in range(n_layers)], None)


def adakv_counts(
    flat_order: np.ndarray, n_tokens: int, n_heads: int, n: int, alpha: float = ADAKV_ALPHA
) -> np.ndarray:
    """Per-head counts for one layer: each head keeps its top ⌊α·n⌋, the rest of H·n goes to the best remaining.

    `flat_order` ranks all H·T (head, rank-within-head) slots of the layer by priority across heads, as
    `head * T + rank`; a head's slots rank in its own order, so the winners are a prefix of each head's ranking
    and the counts say everything. Total = H·n exactly; every head keeps at least max(1, ⌊α·n⌋): a head with no
    position has no attention to run (below n = 1/α the paper's floor is 0 and one head took every slot).
    """
    n = min(n, n_tokens)
    safe = max(1, math.floor(alpha * n)) if n >= 1 else 0
    remaining = n_heads * (n - safe)
    rank_in_head = flat_order % n_tokens
    candidates = flat_order[rank_in_head >= safe][:remaining]
    return safe + np.bincount(candidates // n_tokens, minlength=n_heads)
