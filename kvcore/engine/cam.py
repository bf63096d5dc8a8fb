"""cam: Cache Merging while decoding (Zhang et al., ICML 2024, "CaM: Cache Merging for Memory-efficient LLMs
Inference"), in kvpress's batched form (CAMPress over a StreamingLLM base, as the paper's main setting).

Eviction is streaming_llm's rolling window (the sinks and the most recent budget − n_sink rows). Before a row is
dropped its value is merged into rows that stay, so its information is not simply lost:

- A_i, per kv-head, is the attention row i received from every token fed while decoding (softmax over the rows
  held when that token was fed, mean over the GQA group; the prompt's queries do not count — kvpress's running
  sum starts at the first decode step). The sums follow their rows through evictions.
- The merge candidates of a check are the k latest evicted rows, k = tokens appended since the previous eviction
  (kvpress's layer_step_counts; the rolling window's evicted rows all tie at score 0, kvpress breaks ties by the
  later position). At interval 1 that is the single row leaving the window, the authors' per-step algorithm; an
  eviction before the first token (a prefill kept more than the budget) merges nothing (k = 0, no decode-time
  attention yet), as kvpress's CAMPress only acts on decoding steps.
- Row e merges into the `merge_budget` kept rows right after it in position order (fewer when fewer follow), with
  probability p_e = clamp(A_e / mean_t A_t over those targets, 0, 1) (0 for 0/0, 1 for x/0); each target gets
  p_e · v_e / n_targets added to its value. kvpress draws a Bernoulli(p_e) merge mask; KV Lens adds its expected
  value, so a run is reproducible (and replayable). Contributions are computed from the values before any merge of
  the same check, as kvpress's scatter-add reads the gathered values first.

Keys are not touched. The merges of each check are recorded (evicted position → target position, and the share
of the evicted value added) so the timeline can draw them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.engine.decode_scoring import H2O_ONLINE, Rescorer, head_rows

__all__ = ["CamMerge", "CacheMerger"]


@dataclass(frozen=True)
class CamMerge:
    """One (layer, kv-head)'s merges at a check: pairs[j] = (evicted position, target position), and the share of
    the evicted value added to the target's value (p_e / n_targets)."""

    pairs: np.ndarray  # int32 [n, 2]
    weight: np.ndarray  # float32 [n]


@dataclass
class _Plan:
    targets: list[np.ndarray]  # per head: indices into the kept rows
    deltas: list[np.ndarray]  # per head: float32 [len(targets), D] added to those rows' values
    merges: list[CamMerge]


class CacheMerger:
    """One decode's CaM state: the decode-time attention sums of every held row (h2o_online's accumulation, without
    the prompt's part) and the merges planned at a check."""

    def __init__(self, merge_budget: int) -> None:
        self.merge_budget = merge_budget
        self.attention = Rescorer(H2O_ONLINE, prompt=[])

    def accumulate(
        self, index: int, layer: Any, positions: list[np.ndarray], queries: mx.array | None, scale: float
    ) -> None:
        """Add the attention of the tokens fed since the last check (queries [H_q, n, D], post-RoPE)."""
        self.attention.accumulate(index, layer, positions, queries, scale)

    def plan(
        self, index: int, layer: Any, positions: list[np.ndarray], keep: list[np.ndarray], n_new: int
    ) -> _Plan:
        """The merges of evicting down to `keep` (sorted content rows per head); n_new: tokens since the last
        eviction (how many evicted rows merge)."""
        if hasattr(layer, "bits"):
            raise ValueError("cam merges values in float: decode from an unquantized cache (bits 16)")
        values = _float_values(layer)
        rows = head_rows(layer, positions)
        sums = self.attention.sums.get(index)
        plan = _Plan([], [], [])
        for h, (pos, kept) in enumerate(zip(positions, keep, strict=True)):
            a = np.zeros(len(pos)) if sums is None or not sums[h].size else sums[h].mean(axis=0)
            evicted = np.setdiff1d(np.arange(len(pos)), kept)[::-1][:n_new][::-1]
            v = values[h][rows[h]]
            targets, deltas, pairs, weights = [], [], [], []
            for e in evicted:
                start = int(np.searchsorted(kept, e, side="right"))
                window = np.arange(start, min(start + self.merge_budget, len(kept)))
                if not len(window):
                    continue
                p = _merge_probability(a[e], a[kept[window]].mean())
                share = p / len(window)
                targets.append(window)
                deltas.append(np.broadcast_to(share * v[e], (len(window), v.shape[-1])))
                pairs.append(np.stack([np.full(len(window), pos[e]), pos[kept[window]]], axis=1))
                weights.append(np.full(len(window), share))
            cat = lambda parts, shape, dtype: (  # noqa: E731
                np.concatenate(parts).astype(dtype) if parts else np.zeros(shape, dtype)
            )
            plan.targets.append(cat(targets, (0,), np.int64))
            plan.deltas.append(cat(deltas, (0, v.shape[-1]), np.float32))
            plan.merges.append(CamMerge(cat(pairs, (0, 2), np.int32), cat(weights, (0,), np.float32)))
        return plan

    def apply(
        self, index: int, layer: Any, positions: list[np.ndarray], keep: list[np.ndarray], plan: _Plan
    ) -> None:
        """Add the planned contributions to the values of `layer` (the cache after the eviction, its content rows
        the kept ones in order) and prune the attention sums to the kept rows."""
        rows = head_rows(layer, positions)
        shape = layer.values.shape
        delta = np.zeros((shape[1], shape[2], shape[3]), np.float32)
        for h, (targets, add) in enumerate(zip(plan.targets, plan.deltas, strict=True)):
            np.add.at(delta[h], rows[h][targets], add)
        if delta.any():
            merged = layer.values.astype(mx.float32) + mx.array(delta)[None]
            layer.values = merged.astype(layer.values.dtype)
        sums = self.attention.sums.get(index)
        if sums is not None:
            self.attention.sums[index] = [s[:, k] if s.size else s for s, k in zip(sums, keep, strict=True)]


def _merge_probability(attention: float, window_mean: float) -> float:
    """clamp(A_e / mean A over its targets, 0, 1); 0/0 → 0 and x/0 → 1, as kvpress maps NaN and inf."""
    if window_mean == 0.0:
        return 0.0 if attention == 0.0 else 1.0
    return float(np.clip(attention / window_mean, 0.0, 1.0))


def _float_values(layer: Any) -> np.ndarray:
    """The layer's stored values [H_kv, buffer rows, D] as float32 NumPy."""
    _, values = layer.keys_and_values() if hasattr(layer, "keys_and_values") else (None, layer.values)
    if not hasattr(layer, "n_kept"):
        values = values[..., : layer.offset, :]
    return np.array(values[0].astype(mx.float32))
