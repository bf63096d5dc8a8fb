"""lukv (kvpress's LUKVPress; LU-KV, arXiv 2602.08585): head-wise budgets from a budget curve around a scorer.

A LU-KV budget curve gives, for each compression ratio c = 0.01 … 0.99 and each (layer, kv-head), the fraction of
the prompt that head prunes; it is computed offline for one model and scorer (the LU-KV repository's scripts).
Layer l's row at the run's ratio (index round(100 · (1 − r)) − 1, clipped to 0 … 98) gives each kv-head the ideal
count (1 − prune) · T; the layer keeps round(Σ) in all (at least H_kv), floors each count and gives the remainder
to the heads with the largest fractions, each head then keeping 1 … T. Within a head the inner scores rank the
positions, the first `sink` and last `n_recent` positions above all (kvpress's `window`, renamed: KV Lens's `window`
is the observation window). kvpress's defaults: sink 4, n_recent 1, over
expected_attention (kvpress sets its epsilon to 0.02, the setting its Llama-3.1-8B curve was made with:
`--param attention_epsilon=0.02`; bare lukv keeps expected_attention's own default, 0).

`curve` holds the prune fractions layer-major and head-minor: 99 · L · H_kv values (a whole curve, read at the run's
ratio) or L · H_kv (one row, used at every ratio). Empty: every head prunes 1 − r (uniform budgets).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.declared import param
from kvcore.methods import budgets
from kvcore.methods.base import Pick
from kvcore.methods.wrapper import Wrapper, padded_scores

CURVE_ROWS = 99  # compression ratios 0.01 … 0.99, as LU-KV's curves hold them


def curve_row(
    curve: tuple[float, ...], ratio: float, layer: int, n_layers: int, n_kv_heads: int
) -> np.ndarray:
    """The prune fractions [H_kv] of `layer` at retention `ratio`; ValueError when the curve's length fits neither
    a whole curve nor one row for this model."""
    values = np.asarray(curve, np.float32)
    per_row = n_layers * n_kv_heads
    if values.size == per_row:
        return values.reshape(n_layers, n_kv_heads)[layer]
    if values.size == CURVE_ROWS * per_row:
        index = min(max(int(round((1 - ratio) * 100)) - 1, 0), CURVE_ROWS - 1)
        return values.reshape(CURVE_ROWS, n_layers, n_kv_heads)[index, layer]
    raise ValueError(
        f"lukv: curve has {values.size} values but this model needs {CURVE_ROWS}·{n_layers}·{n_kv_heads} = "
        f"{CURVE_ROWS * per_row} (a whole curve) or {per_row} (one row, layer-major): give one of those"
    )


def head_counts(prune: np.ndarray, n_tokens: int) -> np.ndarray:
    """Per-head kept counts from prune fractions: largest-remainder rounding of (1 − prune) · T, each 1 … T."""
    ideal = np.clip(1 - prune.astype(np.float32), 0, 1) * np.float32(n_tokens)
    n_heads = ideal.size
    total = min(max(int(np.round(ideal.sum(dtype=np.float32))), n_heads), n_heads * n_tokens)
    counts = np.floor(ideal).astype(np.int64)
    remainder = total - int(counts.sum())
    if remainder > 0:
        counts[np.argsort(-(ideal - counts), kind="stable")[: min(remainder, n_heads)]] += 1
    return np.clip(counts, 1, n_tokens)


@dataclass(frozen=True)
class LUKV(Wrapper):
    name = "lukv"
    description = "The inner method with each kv-head's budget read from a LU-KV budget curve"
    paper = (
        "Predicting Future Utility: Global Combinatorial Optimization for Task-Agnostic KV Cache Eviction "
        "(LU-KV, 2026), arXiv:2602.08585"
    )
    default_inner = "expected_attention"
    chooses = True

    sink: int = param(4, "first positions each head always keeps", minimum=0)
    n_recent: int = param(1, "last positions each head always keeps (kvpress's window)", minimum=0)
    curve: tuple[float, ...] = param(
        (),
        "prune fraction per (layer, kv-head), layer-major: 99·L·H (whole curve) or L·H values; empty: 1 − r",
        minimum=0.0,
        maximum=1.0,
    )

    def choose(self, pick: Pick) -> list[np.ndarray]:
        n_heads, n_tokens = pick.scores.shape
        if self.curve:
            prune = curve_row(self.curve, pick.ratio, pick.layer, pick.n_layers, n_heads)
        else:
            prune = np.full(n_heads, 1 - budgets.check_ratio(pick.ratio), np.float32)
        if pick.ratio >= 1:  # kvpress leaves the cache as it is at compression ratio 0
            return [np.arange(n_tokens, dtype=np.int32)] * n_heads
        scores = padded_scores(pick.scores, self.inner.always_kept(n_tokens))
        protected = np.r_[
            np.arange(min(self.sink, n_tokens)), np.arange(max(0, n_tokens - self.n_recent), n_tokens)
        ]
        scores[:, protected] = scores.max() + 1
        order = np.argsort(-scores, axis=1, kind="stable")
        return [np.sort(order[h, :k]).astype(np.int32) for h, k in enumerate(head_counts(prune, n_tokens))]
