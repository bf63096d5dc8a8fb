"""Re-scoring the whole cache while decoding (issue 40): the generic policy and H2O's online accumulation.

Generic re-scoring (kvpress's DecodingPress): at each check (every `interval` tokens) a prefill method scores every
row a layer holds — prompt positions kept so far and generated tokens — from an observation built of those rows'
keys and values and the post-RoPE queries of the tokens fed since the previous check (the observation window;
kvpress keeps the same buffer of hidden states and empties it at every check). The method's own `window` is
capped at the queries available, as kvpress's buffer caps it. Those queries' keys are the last rows of every
head (appended after the previous check, never evicted since), which is what the methods' causal window masks
assume. Before the first token the window is the prefill's last queries whose keys every head still holds.

Ranking is kvcore.methods.selection's: always-kept positions first, then descending score, ties to the lower
row. A layer whose heads hold different row counts (adakv's ragged layers) is scored head by head. adakv spreads
the layer's H_kv·target rows as Feng et al. do: each head keeps its top max(1, ⌊α·target⌋), the rest go to the
best remaining (head, rank) slots across heads.

`expected_attention` while decoding: its query statistics are those of the observation window's queries, each
un-rotated to before RoPE with the layer's own rope module (the prompt observation's `rope`, as leverage un-rotates
keys) — mean and covariance (divided by n) over the window, per query head — and R̄ averages RoPE over the
FUTURE_POSITIONS positions after the newest token. Its sinks are the first n_sink rows each head holds (the first
positions, which no policy evicts before them).

`h2o_online` (Zhang et al. 2023, H2O as its paper defines it, not the prefill `h2o`, which is kvpress's
ObservedAttention): every row's score is the attention it received, summed over every query that saw it — the
prompt's (the prefill's column sums) and each generated token's, over the rows held when that token was fed —
averaged over the kv-head's GQA group. Eviction keeps the most recent `recent` rows (H2O's local window, half the
budget as in the paper) and the heavy hitters by accumulated score for the rest.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache import sparse as caches
from kvcore.capture.prefill import LayerObservation
from kvcore.capture.query_stats import QueryStats, future_rotation, merge
from kvcore.defaults import ADAKV_ALPHA, DEFAULT_QUANT, H2O_RECENT_SHARE
from kvcore.engine.torch_topk import torch_cpu_topk
from kvcore.methods import get
from kvcore.methods.base import Method

#: Prefill methods that re-score the cache from keys, values and recent queries alone.
RESCORING_METHODS = (
    "snapkv",
    "tova",
    "keydiff",
    "rkv",
    "expected_attention",
    "adakv",
    "adakv-snapkv",
    "adakv-knorm",
    "adakv-keydiff",
)
#: Methods whose scores read the observation window's queries (the rest read keys and values only).
_READS_QUERIES = ("snapkv", "tova", "rkv", "expected_attention")
_EXPECTED_ATTENTION = "expected_attention"
H2O_ONLINE = "h2o_online"

__all__ = ["H2O_ONLINE", "RESCORING_METHODS", "QueryBuffer", "Rescorer", "h2o_recent"]


def h2o_recent(target: int) -> int:
    """H2O's local window for a budget: `H2O_RECENT_SHARE` of it, at least 1, leaving one heavy hitter when it can."""
    return max(1, min(target - 1, math.ceil(target * H2O_RECENT_SHARE))) if target > 1 else target


class QueryBuffer:
    """The observer (kvcore.model.attention.observing): per layer, the post-RoPE queries [H_q, D] of the tokens fed
    since the last `take`, recorded lazily (no evaluation inside the forward pass)."""

    def __init__(self, cache: list[Any]) -> None:
        self.queries: dict[int, list[mx.array]] = {}
        self.scale: dict[int, float] = {}
        self.latent = False
        self.bind(cache)

    def bind(self, cache: list[Any]) -> None:
        """Follow the layer objects of `cache` (an eviction builds new ones)."""
        self.layer_of = {id(c): i for i, c in enumerate(cache)}

    def __call__(self, queries, keys, values, cache, scale, mask, latent=False) -> None:
        layer = self.layer_of.get(id(cache))
        if layer is None:
            return
        self.latent |= latent
        self.scale[layer] = float(scale)
        self.queries.setdefault(layer, []).extend(queries[0, :, i] for i in range(queries.shape[2]))

    def take(self, layer: int) -> mx.array | None:
        """This layer's queries since the last take, [H_q, n, D], and forget them."""
        found = self.queries.pop(layer, [])
        return mx.stack(found, axis=1) if found else None


def head_rows(layer: Any, positions: list[np.ndarray]) -> list[np.ndarray]:
    """Per kv-head, the buffer rows holding its content rows in order (a ragged layer's heads skip padding)."""
    if not getattr(layer, "is_ragged", False):
        return [np.arange(len(p)) for p in positions]
    counts, n_prefix = (layer.kept_counts - layer.n_appended).tolist(), layer.n_prefix
    tail = np.arange(n_prefix, n_prefix + layer.n_appended)
    return [np.concatenate([np.arange(c), tail]) for c in counts]


def float_rows(layer: Any) -> tuple[mx.array, mx.array]:
    """The layer's stored keys and values [H_kv, buffer rows, D] as float32 (dequantized when packed)."""
    keys, values = (
        layer.keys_and_values() if hasattr(layer, "keys_and_values") else (layer.keys, layer.values)
    )
    if hasattr(layer, "bits"):
        quant = getattr(layer, "quant", DEFAULT_QUANT)
        keys = caches.dequantized(keys, layer.group_size, layer.bits, quant)
        values = caches.dequantized(values, layer.group_size, getattr(layer, "value_bits", layer.bits), quant)
    if not hasattr(layer, "n_kept"):  # a plain KVCache's buffer runs past its offset
        keys, values = keys[..., : layer.offset, :], values[..., : layer.offset, :]
    return keys[0].astype(mx.float32), values[0].astype(mx.float32)


class Rescorer:
    """One decode's re-scoring state: the method, and for h2o_online the accumulated attention of every held row."""

    def __init__(
        self,
        name: str,
        prompt: list[LayerObservation | None],
        alpha: float = ADAKV_ALPHA,
        window: int | None = None,
        rope_of: Any = None,
    ) -> None:
        self.name = name
        self.window = window
        #: kvpress's form (parity): layer -> its RoPE module; every window query is rotated to the newest position,
        #: and rows are scored in the order kvpress stores them (`kvpress_order`)
        self.rope_of = rope_of
        #: kvpress's form: per (layer, kv-head) the positions its cache holds, in its row order — after an eviction
        #: kvpress gathers rows in topk order (by priority, not position), and snapkv's pooling runs along that order
        self.kvpress_order: dict[tuple[int, int], np.ndarray] = {}
        self.online = name == H2O_ONLINE
        self.method: Method | None = None if self.online else get(name)
        self.alpha = alpha
        self.prompt = prompt
        #: h2o_online: per layer, per kv-head, [group, rows] float64 sums aligned with the head's content rows.
        self.sums: dict[int, list[np.ndarray]] = {}
        self.last_scores: list[np.ndarray] | None = None

    @property
    def reads_queries(self) -> bool:
        if self.online:
            return True
        inner = getattr(self.method, "inner", self.method)
        return inner.name in _READS_QUERIES

    def seed(self, index: int, layer: Any, positions: list[np.ndarray]) -> mx.array | None:
        """Before decoding: h2o_online's prompt sums for the rows held, and the prefill's last queries whose keys
        are the last rows of every head (None when there are none: the check waits for a generated token)."""
        obs = self.prompt[index] if index < len(self.prompt) else None
        if obs is None:
            return None
        if self.online:
            sums = obs.ensure_h2o()
            if sums is None:
                raise ValueError("h2o_online needs the prefill's attention sums: prefill with h2o capture on")
            host = np.array(sums.astype(mx.float32), dtype=np.float64)
            group = host.shape[0] // len(positions)
            self.sums[index] = [host[h * group : (h + 1) * group][:, p] for h, p in enumerate(positions)]
            return None
        n_tokens = obs.n_tokens
        run = min(_trailing_run(p, n_tokens) for p in positions)
        run = min(run, obs.window_queries.shape[1])
        return obs.window_queries[:, obs.window_queries.shape[1] - run :] if run else None

    def accumulate(
        self, index: int, layer: Any, positions: list[np.ndarray], queries: mx.array | None, scale: float
    ) -> None:
        """h2o_online: add each query's softmax attention over the rows held when it was fed (the rows at or before
        its position: nothing was evicted since), in float64 on the host."""
        if not self.online:
            return
        rows = head_rows(layer, positions)
        held = self.sums.get(index)
        if held is None:  # a layer the prefill did not observe: its sums start now
            held = [np.zeros((0, 0))] * len(positions)
        keys, _ = float_rows(layer)
        n_new = 0 if queries is None else queries.shape[1]
        group = 0 if queries is None else queries.shape[0] // len(positions)
        out = []
        for h, (pos, r) in enumerate(zip(positions, rows, strict=True)):
            g = group or held[h].shape[0]
            acc = np.zeros((g, len(pos)))
            acc[:, : held[h].shape[1]] = held[h][:, : len(pos)] if held[h].size else 0.0
            if n_new:
                q = queries[h * group : (h + 1) * group].astype(mx.float32) * scale  # [group, n, D]
                k = keys[h][mx.array(r)]  # [rows, D]
                logits = q @ k.T  # [group, n, rows]
                query_pos = mx.array(pos[-n_new:])[:, None]
                visible = mx.array(pos)[None, :] <= query_pos
                probs = mx.softmax(mx.where(visible, logits, -mx.inf), axis=-1, precise=True)
                acc += np.array(probs, dtype=np.float64).sum(axis=1)
            out.append(acc)
        self.sums[index] = out

    def keep_rows(
        self,
        index: int,
        layer: Any,
        positions: list[np.ndarray],
        queries: mx.array | None,
        target: int,
        scale: float,
    ) -> list[np.ndarray] | None:
        """Per kv-head, the sorted content rows to keep (at most `target`); None when no head holds more."""
        self.last_scores = None
        if max(len(p) for p in positions) <= target:
            return None
        if self.online:
            scores = [s.mean(axis=0) for s in self.sums[index]]
            self.last_scores = scores
            kept = [_heavy_and_recent(s, target) for s in scores]
            self.sums[index] = [s[:, k] for s, k in zip(self.sums[index], kept, strict=True)]
            return kept
        perms = self._kvpress_perms(index, positions) if self.rope_of is not None else None
        scores, always = self._scores(index, layer, positions, queries, scale, perms)
        self.last_scores = scores
        method = self.method
        assert method is not None
        same = all(np.array_equal(positions[0], p) for p in positions)
        ranked = [np.mean(scores, axis=0)] * len(scores) if method.shared_across_heads and same else scores
        if perms is not None and not method.spreads_over_heads:
            orders = [
                _kvpress_priority(s, a, p, min(target, len(s)))
                for s, a, p in zip(ranked, always, perms, strict=True)
            ]
            for h, o in enumerate(orders):
                self.kvpress_order[index, h] = positions[h][o]
            return [np.sort(o) for o in orders]
        orders = [_priority(s, a) for s, a in zip(ranked, always, strict=True)]
        if method.spreads_over_heads:
            alpha = float(method.values().get("alpha", self.alpha))
            counts = _adakv_counts(orders, scores, always, target, alpha)
        else:
            counts = [min(target, len(o)) for o in orders]
        if perms is not None:
            for h, (o, c) in enumerate(zip(orders, counts, strict=True)):
                self.kvpress_order[index, h] = positions[h][o[:c]]
        return [np.sort(o[:c]) for o, c in zip(orders, counts, strict=True)]

    def _window_stats(self, index: int, queries: mx.array, newest: int) -> QueryStats:
        """expected_attention's statistics of the window's queries [H_q, n, D] (post-RoPE, at positions newest −
        n + 1 … newest): un-rotated with the layer's rope module, R̄ over the positions after `newest`."""
        obs = self.prompt[index] if index < len(self.prompt) else None
        rope = None if obs is None else obs.rope
        if rope is None:
            raise ValueError(
                "expected_attention while decoding un-rotates the recent queries with the layer's rope module, "
                "which the prefill did not record for this layer: prefill again, or choose another policy"
            )
        backwards = queries.astype(mx.float32)[None, :, ::-1]  # last position first
        pre_rope = rope(backwards, offset=-newest)[0, :, ::-1]
        count, mean, m2 = merge(0, None, None, pre_rope)
        head_dim = queries.shape[-1]
        rotation = future_rotation(rope, head_dim, newest + 1)
        return QueryStats(pre_rope[:, :0], count, mean, m2, rotation=rotation)

    def _kvpress_perms(self, index: int, positions: list[np.ndarray]) -> list[np.ndarray]:
        """Per head, the content rows (position order) in kvpress's row order: what its last eviction kept, in
        priority order, then the rows appended since."""
        perms = []
        for h, pos in enumerate(positions):
            before = self.kvpress_order.get((index, h), np.zeros(0, np.int64))
            before = before[np.isin(before, pos)]
            order = np.concatenate([before, np.setdiff1d(pos, before)])
            perms.append(np.searchsorted(pos, order))
        return perms

    def _scores(
        self,
        index: int,
        layer: Any,
        positions: list[np.ndarray],
        queries: mx.array | None,
        scale: float,
        perms: list[np.ndarray] | None = None,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The method's scores per kv-head over its content rows, and each head's always-kept rows. perms: score
        each head's rows in that order (kvpress's form), the scores and rows given back in position order."""
        method = self.method
        assert method is not None
        rows = head_rows(layer, positions)
        keys, values = float_rows(layer)
        n_kv = len(positions)
        n_q = 0 if queries is None else queries.shape[1]
        if self.reads_queries and n_q == 0:
            raise ValueError(f"{method.label} re-scores from recent queries and none were recorded")
        if "window" in method.values():
            window = method.values()["window"] if self.window is None else self.window
            method = method.with_values(window=max(1, min(window, n_q)))
        inner = getattr(method, "inner", method)
        stats = None
        if inner.name == _EXPECTED_ATTENTION and queries is not None:
            stats = self._window_stats(index, queries, int(max(p[-1] for p in positions)))
        if self.rope_of is not None and queries is not None:
            queries = _at_newest(self.rope_of(index), queries)
        if perms is not None:
            rows = [r[p] for r, p in zip(rows, perms, strict=True)]
        if all(len(r) == len(rows[0]) for r in rows) and all(np.array_equal(r, rows[0]) for r in rows):
            n = len(rows[0])  # every head's rows: the first n buffer rows, or kvpress's order of them
            shared = mx.array(rows[0]) if perms is not None else slice(0, n)
            obs = _observation(keys[:, shared], values[:, shared], queries, n_kv, scale, stats)
            out = np.array(method.scores(obs, 0), dtype=np.float32)
            scores = list(out)
        else:
            scores = []
            group = 0 if queries is None else queries.shape[0] // n_kv
            for h, r in enumerate(rows):
                index = mx.array(r)
                q = None if queries is None else queries[h * group : (h + 1) * group]
                head_stats = None if stats is None else _stats_of_heads(stats, h * group, (h + 1) * group)
                obs = _observation(
                    keys[h : h + 1][:, index], values[h : h + 1][:, index], q, 1, scale, head_stats
                )
                scores.append(np.array(method.scores(obs, 0), dtype=np.float32)[0])
        always = [np.asarray(method.always_kept(len(s)), np.int64) for s in scores]
        if perms is not None:
            unpermuted = [np.empty_like(sc) for sc in scores]
            for sc, out, p in zip(scores, unpermuted, perms, strict=True):
                out[p] = sc
            scores, always = unpermuted, [p[a] for p, a in zip(perms, always, strict=True)]
        return scores, always


def _observation(
    keys: mx.array,
    values: mx.array,
    queries: mx.array | None,
    n_kv: int,
    scale: float,
    query_stats: QueryStats | None = None,
) -> LayerObservation:
    head_dim = keys.shape[-1]
    q = mx.zeros((n_kv, 0, head_dim), mx.float32) if queries is None else queries
    return LayerObservation(
        keys=keys,
        window_queries=q,
        h2o_sums=None,
        n_q_heads=q.shape[0],
        n_kv_heads=n_kv,
        scale=scale,
        values=values,
        query_stats=query_stats,
    )


def _stats_of_heads(stats: QueryStats, start: int, stop: int) -> QueryStats:
    """The statistics of query heads start … stop − 1 (one kv-head's GQA group)."""
    assert stats.mean is not None and stats.m2 is not None
    return QueryStats(
        stats.head[start:stop],
        stats.count,
        stats.mean[start:stop],
        stats.m2[start:stop],
        rotation=stats.rotation,
    )


def _at_newest(rope: Any, queries: mx.array) -> mx.array:
    """kvpress's DecodingPress re-projects its buffered hidden states and rotates them all with the current step's
    RoPE, so every window query sits at the newest position. Queries j = 0 … n − 1 of consecutive positions, the
    last the newest: RoPE angles add, so rotating query j by n − 1 − j more positions gives that form."""
    n = queries.shape[1]
    moved = [rope(queries[None, :, j : j + 1], offset=n - 1 - j)[0] for j in range(n)]
    return mx.concatenate(moved, axis=1)


def _trailing_run(positions: np.ndarray, n_tokens: int) -> int:
    """How many of the positions n_tokens − 1, n_tokens − 2, … are the last entries of `positions` (sorted)."""
    want = np.arange(n_tokens - 1, n_tokens - 1 - len(positions), -1)
    have = positions[::-1][: len(want)]
    match = have == want[: len(have)]
    return int(len(match) if match.all() else np.argmin(match))


def _kvpress_priority(scores: np.ndarray, always: np.ndarray, perm: np.ndarray, count: int) -> np.ndarray:
    """The `count` content rows kvpress keeps, in the order its gather stores them: torch's CPU topk over the
    scores in kvpress's row order (`perm`: its rows as content rows), the always-kept rows above every score and
    equal among themselves (kvpress pads its window with one value, max + 1)."""
    stored = scores[perm].astype(np.float32)
    stored[np.isin(perm, always)] = np.inf
    return perm[torch_cpu_topk(stored, count)]


def _priority(scores: np.ndarray, always: np.ndarray) -> np.ndarray:
    """Always-kept rows first (in their order), then the rest by descending score, stable (selection's rule)."""
    rest = np.setdiff1d(np.arange(len(scores)), always)
    return np.concatenate([always, rest[np.argsort(-scores[rest], kind="stable")]]).astype(np.int64)


def _adakv_counts(
    orders: list[np.ndarray], scores: list[np.ndarray], always: list[np.ndarray], target: int, alpha: float
) -> list[int]:
    """adakv over heads that may hold different row counts: each keeps its top max(1, ⌊α·target⌋) (as many as it
    holds), the rest of H·target go to the highest-scoring remaining slots across heads (always-kept first)."""
    safe = max(1, math.floor(alpha * target))
    counts = [min(safe, len(o)) for o in orders]
    slots = []
    for h, (o, s, a) in enumerate(zip(orders, scores, always, strict=True)):
        priority = s[o].astype(np.float64)
        priority[: len(a)] = np.inf
        slots += [(-priority[r], h, r) for r in range(counts[h], len(o))]
    slots.sort()
    remaining = sum(min(target, len(o)) for o in orders) - sum(counts)
    for _, h, _ in slots[: max(0, remaining)]:
        counts[h] += 1
    return counts


def _heavy_and_recent(scores: np.ndarray, target: int) -> np.ndarray:
    """H2O's eviction: the last `h2o_recent(target)` rows, and the rest of the target by accumulated score."""
    n = len(scores)
    if n <= target:
        return np.arange(n)
    recent = h2o_recent(target)
    older = np.arange(n - recent)
    heavy = older[np.argsort(-scores[older], kind="stable")[: target - recent]]
    return np.sort(np.concatenate([heavy, np.arange(n - recent, n)]))
