"""Scores -> kept positions. Score and rank once per (method, params); every ratio after that is a slice.

`rank()` runs a method on every captured layer (one MLX evaluation for all layers) and orders each kv-head's
positions by priority: the method's always-kept positions first, then descending score (ties: lower position
first). `select()` turns a ranking and a ratio into what `kvcore.cache.sparse.select_positions` takes per layer:
a 2-D [H_kv, n] array (per head), a 1-D array (shared by all heads), a list of H_kv 1-D arrays of different
lengths (adakv), or None for a layer that was not captured. Indices are sorted, unique, int32.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.defaults import ADAKV_ALPHA
from kvcore.methods import budgets, get
from kvcore.methods.base import Method, Pick

LayerSelection = np.ndarray | list[np.ndarray] | None


@dataclass
class LayerRanking:
    scores: np.ndarray  # [H_kv, T] float32, the method's own scores (what a heatmap shows)
    order: np.ndarray  # [H_kv, T] int32: positions by priority, per kv-head
    shared_order: np.ndarray  # [T] int32: priority of the mean score over heads (shared mode)
    n_always: int  # how many leading entries of each order are always-kept positions
    auxiliary: np.ndarray | None = None  # Method.auxiliary's array (criticalkv's ‖W_o·v‖₁), or None
    _flat_order: np.ndarray | None = field(default=None, repr=False)

    def flat_order(self) -> np.ndarray:
        """adakv's cross-head priority of all (head, rank) slots as head * T + rank; computed on first use."""
        if self._flat_order is None:
            n_heads, n_tokens = self.order.shape
            priority = np.take_along_axis(self.scores, self.order, axis=1).astype(np.float64)
            priority[:, : self.n_always] = np.inf
            self._flat_order = np.argsort(-priority.ravel(), kind="stable").astype(np.int64)
        return self._flat_order


@dataclass
class Ranking:
    method: Method  # with its parameters
    n_tokens: int
    layers: list[LayerRanking | None]
    seconds: float  # scoring + ranking time
    #: the observations scored, for methods that pick positions per ratio (`Method.chooses`)
    observations: Sequence[LayerObservation | None] = field(default=(), repr=False)
    _device_stack: tuple[mx.array, mx.array, dict[int, int]] | None = field(default=None, repr=False)

    def device_stack(self) -> tuple[mx.array, mx.array, dict[int, int]] | None:
        """Every ranked layer's `order` [L', H_kv, T] and `shared_order` [L', T] stacked on the device, copied once,
        with each layer's row in them: one sort then serves all layers of a budget. None when shapes differ."""
        ranked = [(i, r) for i, r in enumerate(self.layers) if r is not None]
        if not ranked or len({r.order.shape for _, r in ranked}) != 1:
            return None
        if self._device_stack is None:
            order = mx.array(np.stack([r.order for _, r in ranked]))
            shared = mx.array(np.stack([r.shared_order for _, r in ranked]))
            mx.eval(order, shared)
            self._device_stack = (order, shared, {i: j for j, (i, _) in enumerate(ranked)})
        return self._device_stack


def _priority_order(scores: np.ndarray, always: np.ndarray) -> np.ndarray:
    """Per row: the always-kept positions (in their given order), then the rest by descending score, stable."""
    n_rows, n_tokens = scores.shape
    rest = np.setdiff1d(np.arange(n_tokens), always)
    by_score = rest[np.argsort(-scores[:, rest], axis=1, kind="stable")]
    head = np.broadcast_to(always, (n_rows, always.size))
    return np.concatenate([head, by_score], axis=1).astype(np.int32)


def rank(
    observations: Sequence[LayerObservation | None],
    method: str | Method,
) -> Ranking:
    """Score every captured layer with `method` and rank its positions; None stays None."""
    start = time.perf_counter()
    method = get(method) if isinstance(method, str) else method
    if method.needs_h2o:
        for o in observations:
            if o is not None:
                o.ensure_h2o()
    if method.needs_h2o and any(o is not None and o.h2o_sums is None for o in observations):
        raise ValueError(f"{method.name} needs h2o sums: prefill with capture h2o=True")
    lazy = [None if o is None else method.scores(o, i) for i, o in enumerate(observations)]
    extra = [None if o is None else method.auxiliary(o, i) for i, o in enumerate(observations)]
    mx.eval([s for s in lazy + extra if s is not None])
    n_tokens = next((o.n_tokens for o in observations if o is not None), 0)
    always = np.asarray(method.always_kept(n_tokens), np.int64)
    layers: list[LayerRanking | None] = []
    for s, aux in zip(lazy, extra, strict=True):
        if s is None:
            layers.append(None)
            continue
        scores = np.array(s, dtype=np.float32)
        shared = _priority_order(scores.mean(axis=0, keepdims=True), always)[0]
        order = _priority_order(scores, always) if not method.shared_across_heads else None
        if order is None:
            order = np.broadcast_to(shared, scores.shape)
        auxiliary = None if aux is None else np.array(aux, dtype=np.float32)
        layers.append(LayerRanking(scores, order, shared, int(always.size), auxiliary))
    return Ranking(method, n_tokens, layers, time.perf_counter() - start, list(observations))


def layer_budgets(ranking: Ranking, ratio: float) -> list[int]:
    """Per-layer, per-kv-head counts: the pyramid for pyramidkv (or its uniform fallback), else uniform."""
    n_layers, n_tokens = len(ranking.layers), ranking.n_tokens
    if ranking.method.keeps_everything:
        budgets.check_ratio(ratio)
        return [n_tokens] * n_layers
    if ranking.method.budget == "pyramidkv":
        return _pyramid(ranking, ratio).counts
    own = ranking.method.counts(n_tokens, ratio, n_layers)
    if own is not None:
        return own
    return budgets.uniform(n_tokens, ratio, n_layers)


def budget_note(ranking: Ranking, ratio: float) -> str | None:
    """Why a per-layer budget rule fell back to uniform counts at `ratio` (pyramidkv), or None when it did not.

    Shown by the CLI, the app and the stats CSV, so a "pyramidkv" result that is really snapkv is never silent.
    """
    if ranking.method.budget != "pyramidkv" or ranking.method.keeps_everything:
        return None
    why = _pyramid(ranking, ratio).fallback
    return None if why is None else f"{ranking.method.name}: uniform budgets ({why})"


def _pyramid(ranking: Ranking, ratio: float) -> budgets.PyramidBudget:
    values = ranking.method.values()
    return budgets.pyramidkv(ranking.n_tokens, ratio, len(ranking.layers), values["window"], values["beta"])


def select(
    ranking: Ranking, ratio: float, per_head: bool = True, adakv: bool = False
) -> list[LayerSelection]:
    """Kept positions per layer for `ratio` (fraction of prompt positions kept, in (0, 1]).

    per_head=False keeps the same positions in every head of a layer (ranked by the mean score over heads);
    adakv=True (or an AdaKV method) spreads each layer's H_kv·n over its heads (ragged lists).
    """
    method = ranking.method
    if method.budget == "global":
        if not per_head:
            raise ValueError(f"{method.label} evicts per kv-head across layers: turn per-head selection on")
        return global_select(ranking, ratio, bool(method.values().get("layerwise", 0)))
    adakv = adakv or method.spreads_over_heads
    if adakv and (not per_head or method.shared_across_heads or method.keeps_everything):
        raise ValueError(f"adakv needs per-head selection with a per-head scorer, got {method.name!r} shared")
    if method.chooses and not per_head and not method.shared_across_heads:
        raise ValueError(f"{method.label} picks positions per kv-head: select per head (per_head=True)")
    ranked = [r.scores for r in ranking.layers if r is not None]
    bounds = (
        (min(float(s.min()) for s in ranked), max(float(s.max()) for s in ranked)) if ranked else (0.0, 0.0)
    )
    across = method.across_layers([None if r is None else r.scores for r in ranking.layers], ratio)
    if across is not None:
        if not per_head:
            raise ValueError(f"{method.label} keeps positions per kv-head: select per head (per_head=True)")
        return across
    out: list[LayerSelection] = []
    every = tuple(None if r is None else r.scores for r in ranking.layers)
    for i, (layer, n) in enumerate(zip(ranking.layers, layer_budgets(ranking, ratio), strict=True)):
        if layer is None:
            out.append(None)
        elif method.chooses:
            obs = ranking.observations[i]
            pick = Pick(
                obs,
                layer.scores,
                layer.order,
                layer.auxiliary,
                n,
                ratio,
                i,
                bounds,
                len(ranking.layers),
                every,
            )
            out.append(method.choose(pick))
        elif method.keeps_everything:
            out.append(np.arange(ranking.n_tokens, dtype=np.int32))
        elif not per_head or method.shared_across_heads:
            out.append(np.sort(layer.shared_order[:n]))
        elif adakv:
            n_heads, n_tokens = layer.order.shape
            alpha = method.values().get("alpha", ADAKV_ALPHA)
            counts = budgets.adakv_counts(layer.flat_order(), n_tokens, n_heads, n, alpha)
            out.append([np.sort(layer.order[h, :k]) for h, k in enumerate(counts)])
        else:
            out.append(np.sort(layer.order[:, :n], axis=1))
    return out


def global_select(ranking: Ranking, ratio: float, layerwise: bool = False) -> list[LayerSelection]:
    """kvzip's selection (kvpress's KVzipPress): evict the int(N·(1 − r)) lowest scores of all N (layer, kv-head,
    position) slots (layerwise: of each layer's H_kv·T slots), never the always-kept positions; ragged per head.

    Each head keeps a prefix of its own `order` (so `device_select` rebuilds the same rows): among equal scores
    the later position goes first, and across heads the lower layer and head (kvpress's `topk` picks among ties
    arbitrarily). A head left with nothing keeps its first position in order (kvpress would attend over no key).
    """
    budgets.check_ratio(ratio)
    ranked = [(i, r) for i, r in enumerate(ranking.layers) if r is not None]
    out: list[LayerSelection] = [None] * len(ranking.layers)
    if not ranked:
        return out
    reversed_priority = []  # per layer [H_kv, T]: each head's priorities from its last ranked position to its first
    for _, layer in ranked:
        p = np.take_along_axis(layer.scores.astype(np.float64), layer.order, axis=1)
        p[:, : layer.n_always] = np.inf
        reversed_priority.append(p[:, ::-1])
    groups = [[k] for k in range(len(ranked))] if layerwise else [list(range(len(ranked)))]
    for group in groups:
        flat = np.concatenate([reversed_priority[k].ravel() for k in group])
        n_evicted = int(flat.size * (1.0 - ratio))
        evicted = np.zeros(flat.size, bool)
        evicted[np.argsort(flat, kind="stable")[:n_evicted]] = True
        offset = 0
        for k in group:
            n_heads, n_tokens = reversed_priority[k].shape
            counts = n_tokens - evicted[offset : offset + n_heads * n_tokens].reshape(n_heads, n_tokens).sum(
                1
            )
            offset += n_heads * n_tokens
            order = ranked[k][1].order
            out[ranked[k][0]] = [np.sort(order[h, : max(int(c), 1)]) for h, c in enumerate(counts)]
    return out


def final_scores(ranking: Ranking, ratio: float) -> list[np.ndarray | None]:
    """Per layer [H_kv, T]: the scores the kept positions were finally chosen by at `ratio` (a wrapper's chunk
    means rather than its inner method's scores), what the heatmap's Score view shows; None for a layer not ranked."""
    method, out = ranking.method, []
    every = tuple(None if r is None else r.scores for r in ranking.layers)
    ranked = [s for s in every if s is not None]
    bounds = (
        (min(float(s.min()) for s in ranked), max(float(s.max()) for s in ranked)) if ranked else (0.0, 0.0)
    )
    counts = layer_budgets(ranking, ratio) if method.chooses else [0] * len(ranking.layers)
    for i, (layer, n) in enumerate(zip(ranking.layers, counts, strict=True)):
        if layer is None or not method.chooses:
            out.append(None if layer is None else layer.scores)
            continue
        pick = Pick(
            ranking.observations[i],
            layer.scores,
            layer.order,
            layer.auxiliary,
            n,
            ratio,
            i,
            bounds,
            len(every),
            every,
        )
        found = method.final_scores(pick)
        out.append(layer.scores if found is None else found)
    return out


def selects_on_device() -> bool:
    """Whether Session builds kept rows on the device (a GPU: uploading them costs more than the gathers) or sends
    them from the host (a CPU: the "upload" is a copy in the same memory, and NumPy sorts faster than MLX there)."""
    return mx.default_device().type == mx.gpu


def device_select(ranking: Ranking, selection: Sequence[LayerSelection]) -> list[mx.array | None] | None:
    """`selection` (select()'s for this ranking) built again on the device from the ranking's orders, so a slider
    move sends no indices: each layer's kept rows are the sorted first counts of its order, as select() takes them.

    Ragged layers come padded with 0 past each head's count, as `kvcore.cache.index_checks.host_indices` pads them.
    None when the layers' orders differ in shape (no stack) or the method picks its own positions (`chooses`):
    the caller sends the host's indices instead.
    """
    found = None if ranking.method.chooses else ranking.device_stack()
    if found is None:
        return None
    order, shared, row = found
    out: list[mx.array | None] = [None] * len(selection)
    by_n: dict[int, list[int]] = {}  # per-head layers by budget: one sort each
    for i, (layer, kept) in enumerate(zip(ranking.layers, selection, strict=True)):
        if layer is None or kept is None:
            continue
        if ranking.method.keeps_everything:
            out[i] = mx.arange(ranking.n_tokens, dtype=mx.int32)
        elif isinstance(kept, list):
            counts = np.array([len(k) for k in kept], dtype=np.int32)
            width, past = int(counts.max()), ranking.n_tokens
            beyond = mx.arange(width, dtype=mx.int32)[None, :] >= mx.array(counts)[:, None]
            ordered = mx.sort(mx.where(beyond, past, order[row[i], :, :width]), axis=1)
            out[i] = mx.where(ordered == past, 0, ordered)
        elif kept.ndim == 1:
            out[i] = mx.sort(shared[row[i], : kept.shape[0]])
        else:
            by_n.setdefault(kept.shape[1], []).append(i)
    for n, layers in by_n.items():
        rows = [row[i] for i in layers]
        part = order if rows == list(range(order.shape[0])) else order[mx.array(rows)]
        ordered = mx.sort(part[:, :, :n], axis=-1)
        for k, i in enumerate(layers):
            out[i] = ordered[k]
    return out
