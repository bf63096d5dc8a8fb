"""Pre-RoPE query statistics for expected_attention, gathered during the one prefill (no second pass).

mlx-lm's attention modules call `self.rope(queries, offset=...)` and hand the result straight to the attention
function kvcore observes. `tapped(model, taps)` wraps every module's `rope` for the duration of one capture:
each call remembers its input by the identity of its output, so the observer, given the post-RoPE queries,
finds the pre-RoPE ones — after whatever the model does before RoPE (qwen3's q_norm), with nothing recomputed.
A layer whose queries reach attention another way gets no statistics (expected_attention then says so).

Per layer the statistics are the first `QUERY_STATS_HEAD` pre-RoPE queries one by one (so n_sink can change
after prefill) and, for the positions after them, a count, a mean and a centred sum of outer products merged
chunk by chunk (Chan et al.'s pairwise update: no cancellation as E[qqᵀ] − μμᵀ would have), all float32.
State lives in the objects one capture creates: nothing is shared between models or prefills.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from kvcore.defaults import FUTURE_POSITIONS, QUERY_STATS_HEAD


@dataclass
class QueryStats:
    """One layer's pre-RoPE query statistics over prompt positions 0 … T−1 (float32 arrays, [H_q, ...])."""

    head: mx.array  # [H_q, min(T, QUERY_STATS_HEAD), D]: the first queries themselves
    count: int  # positions after the head
    mean: mx.array | None  # [H_q, D] over those positions (None when count is 0)
    m2: mx.array | None  # [H_q, D, D]: Σ (q − mean)(q − mean)ᵀ over them
    rope: Any = None  # the layer's own rope module, for the rotation (None once `rotation` is known)
    rotation: mx.array | None = None  # [D, D]: mean RoPE matrix of positions T … T+511, computed on first use

    @property
    def n_tokens(self) -> int:
        return self.head.shape[1] + self.count

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.head, self.mean, self.m2, self.rotation) if a is not None]

    def mean_rotation(self) -> mx.array | None:
        """R̄ from the layer's rope module (computed once, not during the prefill: it is not the capture's cost)."""
        if self.rotation is None and self.rope is not None:
            self.rotation = future_rotation(self.rope, self.head.shape[-1], self.n_tokens)
            self.rope = None
        return self.rotation

    def moments(self, n_sink: int) -> tuple[int, mx.array, mx.array]:
        """(n, mean [H_q, D], covariance [H_q, D, D]) of the queries at positions n_sink … T−1; n ≥ 1."""
        if n_sink > QUERY_STATS_HEAD:
            raise ValueError(
                f"expected_attention takes n_sink up to {QUERY_STATS_HEAD} (the queries kept one by one at "
                f"prefill), got {n_sink}: lower n_sink"
            )
        rows = self.head[:, n_sink:]
        count, mean, m2 = self.count, self.mean, self.m2
        if rows.shape[1]:
            count, mean, m2 = merge(count, mean, m2, rows)
        return count, mean, m2 / count


def merge(
    count: int, mean: mx.array | None, m2: mx.array | None, rows: mx.array
) -> tuple[int, mx.array, mx.array]:
    """Add `rows` [H, m, D] (float32, m ≥ 1) to (count, mean, m2): Chan's pairwise update."""
    m = rows.shape[1]
    rows_mean = rows.mean(axis=1)
    centred = rows - rows_mean[:, None]
    rows_m2 = centred.transpose(0, 2, 1) @ centred
    if count == 0 or mean is None or m2 is None:
        return m, rows_mean, rows_m2
    total = count + m
    delta = rows_mean - mean
    outer = delta[:, :, None] * delta[:, None, :]
    return total, mean + delta * (m / total), m2 + rows_m2 + outer * (count * m / total)


def accumulate(stats: QueryStats | None, pre_rope: mx.array, first: int) -> QueryStats:
    """`stats` plus the chunk of pre-RoPE queries [H_q, N, D] at positions first … first+N−1."""
    q = pre_rope.astype(mx.float32)
    split = max(0, min(QUERY_STATS_HEAD - first, q.shape[1]))
    if stats is None:
        stats = QueryStats(q[:, :0], 0, None, None)
    head = mx.concatenate([stats.head, q[:, :split]], axis=1) if split else stats.head
    count, mean, m2 = stats.count, stats.mean, stats.m2
    if split < q.shape[1]:
        count, mean, m2 = merge(count, mean, m2, q[:, split:])
    return QueryStats(head, count, mean, m2)


def future_rotation(rope: Any, head_dim: int, n_tokens: int) -> mx.array:
    """R̄ [D, D]: the mean of the model's own RoPE matrices at positions T … T + FUTURE_POSITIONS − 1.

    RoPE is linear in its input, so feeding the identity basis through the layer's rope module (its frequencies,
    llama3 / yarn / su scaling and mscale included) at those positions gives each matrix's columns."""
    basis = mx.repeat(mx.eye(head_dim, dtype=mx.float32)[:, None, :], FUTURE_POSITIONS, axis=1)
    rotated = rope(basis, offset=n_tokens)  # [D (column j), P, D]: M_p e_j (3-D runs ~2.5x faster than 4-D)
    return rotated.astype(mx.float32).mean(axis=1).T


class RopeTap(nn.Module):
    """Wraps one rope module during a capture: same output, and its input remembered by the output's identity."""

    def __init__(self, inner: nn.Module, taps: Taps) -> None:
        super().__init__()
        self.inner = inner
        self._taps = taps

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        out = self.inner(x, *args, **kwargs)
        self._taps.seen[id(out)] = (out, x, self.inner)
        return out


class Taps:
    """What the rope taps of one capture saw since the last attention call (cleared at every call)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[mx.array, mx.array, nn.Module]] = {}

    def pre_rope(self, queries: mx.array) -> tuple[mx.array, nn.Module] | None:
        """(pre-RoPE queries, the rope module) for these post-RoPE `queries`, or None; forgets the rest."""
        entry = self.seen.get(id(queries))
        self.seen.clear()
        if entry is None or entry[0] is not queries or entry[1].shape != queries.shape:
            return None
        return entry[1], entry[2]


@contextmanager
def tapped(model: nn.Module, taps: Taps) -> Iterator[None]:
    """Wrap every `rope` child of the model's modules in a `RopeTap`; restore the originals on exit."""
    wrapped = []
    for module in model.modules():
        rope = module.get("rope") if isinstance(module, nn.Module) else None
        if isinstance(rope, nn.Module) and not isinstance(rope, RopeTap):
            wrapped.append((module, rope))
    try:
        for module, rope in wrapped:
            module.rope = RopeTap(rope, taps)
        yield
    finally:
        for module, rope in wrapped:
            module.rope = rope
        taps.seen.clear()
