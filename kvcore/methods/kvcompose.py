"""kvcompose (kvpress's KVComposePress; KVCompose, arXiv 2509.05165): composite tokens aligned across heads.

After the context is prefilled the model reads the context again (kvpress's default when no question is given);
each context pair's score is the attention the re-read's queries pay it (softmax over the context and the re-read
so far, as eager attention computes it), aggregated over the queries (`agg_task`, max) and over each kv-head's
query group (`agg_group`, mean); optionally times ‖v‖₂ (`add_v_norm`), plus the layer's mean over kv-heads
(`add_mean_across_heads`). Budgets are global: each head's scores sorted in descending order are its "composite
tokens" (the i-th best of every head form composite token i); the n_kept(L·T) best composite scores over all layers
(a layer's composite = `agg_head` over its heads' sorted scores, layer 0's raised to the maximum over layers) set
each layer's count (at least 1) — structured: every head of a layer keeps that many, its own best positions, so
the layer stays a dense [H_kv, n] cache. Unstructured (`structured` 0): the n_kept(L·H·T) best sorted scores over
every head set each head's count (KV Lens keeps at least one where kvpress could leave a head empty). The first
`keep_token_lower_bound` composite tokens of every head count first.

The re-read is a forward pass: Session runs it through the reconstruction hook (`needs_reconstruction`,
`reconstruct`, `kvcore.capture.reconstruction.replay`, as kvzip); the scores are cached on each observation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import BLOCK_ELEMENTS, LayerObservation
from kvcore.declared import param
from kvcore.defaults import REREAD_SCORES
from kvcore.methods import budgets
from kvcore.methods.base import Method

if TYPE_CHECKING:
    from kvcore.methods.base import Pick

AGGREGATES = ("max", "mean")
STRUCTURES = ("unstructured", "structured")
#: The last `select` call's counts, found again by the identity of its scores tuple (one per call): every layer of
#: that call reads them instead of sorting all layers again.
_last_counts: dict[str, Any] = {}
COUNTED_FIRST = 1e9  # kvpress's lift of the first keep_token_lower_bound composite tokens


def context_attention(
    queries: mx.array, keys: mx.array, n_context: int, scale: float, agg: str, n_queries: int | None = None
) -> mx.array:
    """[H_q, T]: the re-read's queries [H_q, N, D] — the last N positions of keys [H_kv, K, D], causal among the
    re-read's own — attending over the keys; each context column aggregated over the queries: max, or the sum over
    `n_queries` (default N; a step of a longer re-read passes the whole re-read's count, so the steps add up to
    its mean). Query rows are independent, so they go in blocks of at most BLOCK_ELEMENTS probabilities."""
    n_q_heads, n_new, head_dim = queries.shape
    n_kv_heads, n_keys = keys.shape[0], keys.shape[1]
    group = n_q_heads // n_kv_heads
    first = n_keys - n_new  # the position of the first query
    q = queries.astype(mx.float32).reshape(n_kv_heads, group, n_new, head_dim)
    k_t = keys.astype(mx.float32).transpose(0, 2, 1)[:, None]  # [H_kv, 1, D, K]
    block = max(1, BLOCK_ELEMENTS // (n_q_heads * n_keys))
    found = None
    for a in range(0, n_new, block):
        b = min(a + block, n_new)
        logits = (q[:, :, a:b] @ k_t) * scale  # [H_kv, group, b − a, K]
        visible = mx.arange(n_keys)[None, :] <= (first + mx.arange(a, b))[:, None]
        probs = mx.softmax(mx.where(visible, logits, -mx.inf), axis=-1, precise=True)[..., :n_context]
        part = probs.max(axis=2) if agg == "max" else probs.sum(axis=2)
        found = part if found is None else (mx.maximum(found, part) if agg == "max" else found + part)
        mx.async_eval(found)
    out = found if agg == "max" else found / (n_queries or n_new)
    return out.reshape(n_q_heads, n_context)


def token_scores(per_query_head: mx.array, values: mx.array | None, method: KVCompose) -> mx.array:
    """[H_kv, T]: the group aggregate of each kv-head's query heads, optionally times ‖v‖₂, plus the layer's
    mean over kv-heads."""
    n_q_heads, n_tokens = per_query_head.shape
    n_kv_heads = n_q_heads if values is None else values.shape[0]
    grouped = per_query_head.reshape(n_kv_heads, n_q_heads // n_kv_heads, n_tokens)
    scores = grouped.max(axis=1) if AGGREGATES[method.agg_group] == "max" else grouped.mean(axis=1)
    if method.add_v_norm:
        v = values.astype(mx.float32)
        scores = scores * mx.sqrt((v * v).sum(axis=-1))
    if method.add_mean_across_heads:
        scores = scores + scores.mean(axis=0, keepdims=True)
    return scores


def composite_counts(
    layers: list[np.ndarray], ratio: float, structured: bool, agg_head: str, lower_bound: int
) -> list[np.ndarray]:
    """Per layer, each kv-head's kept count (structured: one count for all its heads), from every layer's scores
    [H_kv, T] (module docstring). Ties at the global boundary: lower layer and head first."""
    by_head = np.stack([-np.sort(-s.astype(np.float64), axis=1) for s in layers])  # [L, H, T] descending
    n_layers, n_heads, n_tokens = by_head.shape
    lifted = by_head.copy()
    lifted[..., :lower_bound] += COUNTED_FIRST
    if not structured:
        n = budgets.n_kept(lifted.size, ratio)
        top = np.argsort(-lifted.ravel(), kind="stable")[:n] // n_tokens
        counts = np.bincount(top, minlength=n_layers * n_heads).reshape(n_layers, n_heads)
        return [np.maximum(c, 1) for c in counts]
    per_layer = by_head.max(axis=1) if agg_head == "max" else by_head.mean(axis=1)  # [L, T]
    per_layer[:, :lower_bound] += COUNTED_FIRST
    per_layer[0] = per_layer.max(axis=0)
    n = budgets.n_kept(per_layer.size, ratio)
    top = np.argsort(-per_layer.ravel(), kind="stable")[:n] // n_tokens
    counts = np.maximum(np.bincount(top, minlength=n_layers), max(1, lower_bound))
    return [np.full(n_heads, min(c, n_tokens)) for c in counts]


@dataclass(frozen=True)
class KVCompose(Method):
    name = "kvcompose"
    description = (
        "KVCompose: attention while the model re-reads the context; composite tokens aligned across heads, "
        "budgets global over layers"
    )
    paper = (
        "KVCompose: Efficient Structured KV Cache Compression with Composite Tokens (2025), arXiv:2509.05165"
    )
    chooses = True
    needs_reconstruction = True

    structured: int = param(
        1,
        "structured: one count per layer (a dense cache); unstructured: one per kv-head",
        choices=STRUCTURES,
    )
    agg_task: int = param(0, "over the re-read's queries", choices=AGGREGATES)
    agg_group: int = param(1, "over a kv-head's query heads", choices=AGGREGATES)
    agg_head: int = param(1, "over a layer's heads' sorted scores (composite tokens)", choices=AGGREGATES)
    add_v_norm: int = param(0, "1: scores times ‖v‖₂", minimum=0, maximum=1)
    add_mean_across_heads: int = param(1, "1: add the layer's mean score over kv-heads", minimum=0, maximum=1)
    keep_token_lower_bound: int = param(0, "composite tokens every head keeps first", minimum=0)

    @property
    def reconstruction_key(self) -> tuple:
        """What the cached scores depend on (not the budget rule)."""
        return ("kvcompose", self.agg_task, self.agg_group, self.add_v_norm, self.add_mean_across_heads)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        cached = getattr(obs, "reconstruction", None)
        if cached is None:
            raise ValueError(
                "kvcompose needs Session's pass that re-reads the context (the reconstruction hook kvzip brings), "
                "which this build lacks: choose another method"
            )
        found = cached.get(self.reconstruction_key)
        if found is None:
            raise ValueError(
                "kvcompose scores come from a pass that re-reads the context: rank it through Session "
                "(which runs the pass)"
            )
        return found

    def reconstruct(self, model: Any, tokenizer: Any, capture: Any, ids: list[int], templated: bool) -> int:
        """Re-read the context `ids` after `capture`'s cache and cache each layer's scores on its observation;
        returns the forward calls (1). The whole prompt is re-read, template included, as kvpress; a long one in
        steps (`REREAD_SCORES`), whose per-step aggregates add up to the one pass's."""
        from kvcore.capture import reconstruction

        key = self.reconstruction_key
        observed = [o for o in capture.observations if o is not None]
        if not observed or all(key in o.reconstruction for o in observed):
            return 0
        if any(o.latent for o in observed):
            raise ValueError("kvcompose re-reads the context through full-rank attention: not on MLA models")
        n_tokens, agg = len(ids), AGGREGATES[self.agg_task]
        # in steps, so no layer's attention holds more than REREAD_SCORES scores (one step for a short prompt)
        step = max(1, REREAD_SCORES // (observed[0].n_q_heads * 2 * n_tokens))
        per_layer: dict[int, mx.array] = {}

        def observe(layer, queries, keys, values, scale, row_norms) -> list[mx.array]:
            part = context_attention(queries[0], keys[0], n_tokens, scale, agg, n_tokens)
            found = per_layer.get(layer)
            if found is not None:
                part = mx.maximum(found, part) if agg == "max" else found + part
            per_layer[layer] = part
            return [part]

        reconstruction.replay(model, capture.cache, ids, observe, step=step)
        for layer, obs in enumerate(capture.observations):
            if obs is None:
                continue
            if layer not in per_layer:
                raise ValueError(f"layer {layer} was not seen by kvcompose's re-read")
            obs.reconstruction[key] = token_scores(per_layer[layer], obs.values, self)
        mx.eval([o.reconstruction[key] for o in observed])
        return 1

    def choose(self, pick: Pick) -> np.ndarray | list[np.ndarray]:
        rule = (self, pick.ratio)
        if _last_counts.get("scores") is not pick.all_scores or _last_counts.get("rule") != rule:
            ranked = [s for s in pick.all_scores if s is not None]  # the budget is global over layers
            counts = composite_counts(
                ranked,
                pick.ratio,
                bool(self.structured),
                AGGREGATES[self.agg_head],
                self.keep_token_lower_bound,
            )
            at = iter(counts)
            every = [None if s is None else next(at) for s in pick.all_scores]
            _last_counts.update(scores=pick.all_scores, rule=rule, counts=every)
        mine = _last_counts["counts"][pick.layer]
        order = np.argsort(-pick.scores, axis=1, kind="stable")
        if self.structured:
            return np.sort(order[:, : int(mine[0])], axis=1).astype(np.int32)
        return [np.sort(order[h, :k]).astype(np.int32) for h, k in enumerate(mine)]
