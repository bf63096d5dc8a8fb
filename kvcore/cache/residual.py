"""A full-precision residual beside a packed cache: the sinks and the most recent prompt positions stay float.

KIVI-style schemes keep the tokens attention leans on hardest unquantized. With `fp_recent = R`, a layer's kept
prompt positions split, per kv-head, into

    residual   positions < n_sink (the attention sinks) or >= T − R (the last R prompt positions): float rows
    body       every other kept position: packed at the configuration's key / value widths

and each part is stored for real, in its own sparse cache (the body a SparseQuantizedKVCache, the residual a
SparseKVCache), so bytes are the sum of both stores. Only kept positions are split: the method decides what is
kept, the residual only decides how it is stored. Tokens appended after compression (decode) go to the residual
and stay float, as in KIVI's residual; unlike KIVI, they are never packed later (a continuation here is at most a
few hundred tokens).

Attention runs over both stores as over one key set: the scores of the packed body and of the float residual are
joined before one softmax, so the output equals attention over the dequantized body concatenated with the float
rows (in any row order: softmax and the weighted sum do not depend on it). The residual's appended rows are its
last rows, so a bottom-right causal mask over the residual is the right mask for several new tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache.sparse import SparseKVCache, SparseQuantizedKVCache, copy_cache, take_rows

__all__ = ["ResidualKVCache", "residual_mask", "split_select"]


def two_part_mask(size: int, N: int, return_array: bool, window_size: int | None, kind: str) -> Any:
    """mlx-lm's make_mask for a layer whose `attend` builds its own masks over two stores: None for one new token,
    "causal" for several (or the boolean array when asked); a sliding window is refused (full attention only)."""
    if window_size is not None:
        raise ValueError(f"window_size={window_size}: a {kind} layer is a full-attention layer")
    if N == 1:
        return None
    if return_array:
        total = size + N
        return mx.arange(size, total)[:, None] >= mx.arange(total)[None]
    return "causal"


class ResidualKVCache:
    """A packed body (`body`, never appended to) and a float residual (`residual`, which takes every new token).

    mlx-lm's models read `offset` (RoPE), call `update_and_fetch` and hand what it returns to the attention
    function; `kvcore.model.attention.sdpa` sees this class and calls `attend`.
    """

    def __init__(self, body: SparseQuantizedKVCache, residual: SparseKVCache) -> None:
        self.body, self.residual = body, residual

    @property
    def offset(self) -> int:
        return self.residual.offset

    @property
    def keys(self) -> Any:
        return self.residual.keys

    @property
    def bits(self) -> int:
        return self.body.bits

    @property
    def value_bits(self) -> int:
        return self.body.value_bits

    @property
    def group_size(self) -> int:
        return self.body.group_size

    @property
    def quant(self) -> str:
        return self.body.quant

    @property
    def n_heads(self) -> int:
        return self.residual.n_heads

    @property
    def nbytes(self) -> int:
        """Both stores' rows (padding included): what the layer really holds."""
        return self.body.nbytes + self.residual.nbytes

    @property
    def kept_counts(self) -> np.ndarray:
        return self.body.kept_counts + self.residual.kept_counts

    def size(self) -> int:
        return self.body.size() + self.residual.size()

    def empty(self) -> bool:
        return False

    def is_trimmable(self) -> bool:
        return False

    def branch(self) -> ResidualKVCache:
        """An independent copy (`kvcore.cache.sparse.copy_cache` calls it): appends to one never reach the other."""
        body, residual = copy_cache([self.body, self.residual])
        return ResidualKVCache(body, residual)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Any:
        """As a sparse layer's: None for one new token, "causal" for several (attend builds its own masks)."""
        return two_part_mask(self.size(), N, return_array, window_size, "residual")

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        """New tokens join the float residual; returns (body keys, residual keys), (body values, residual values)."""
        res_k, res_v = self.residual.update_and_fetch(keys, values)
        body_k, body_v = self.body.keys_and_values()
        return (body_k, res_k), (body_v, res_v)

    def attend(self, queries: mx.array, keys: Any, values: Any, scale: float) -> mx.array:
        """Softmax attention over the body's and the residual's rows at once (see the module docstring)."""
        from kvcore.model.attention import quantized_or_float_matmul, rotation_of, simulated_of

        (body_k, res_k), (body_v, res_v) = keys, values
        B, n_q_heads, L, D = queries.shape
        n_kv = res_k.shape[1]
        rep = n_q_heads // n_kv
        q = mx.reshape(queries * scale, (B, n_kv, rep, L, D))
        group, kb, vb, mode = self.group_size, self.bits, self.value_bits, self.body.mode
        rot, sim = rotation_of(self.body.scheme), simulated_of(self.body.scheme)
        expand = tuple  # parts of one side, each [B, H, n, *] -> [B, H, 1, n, *] to broadcast over the group
        body_k, body_v = (expand(mx.expand_dims(x, 2) for x in side) for side in (body_k, body_v))
        n_body = body_k[0].shape[3]
        scores = [quantized_or_float_matmul(q, body_k, True, group, kb, mode, rot, sim)] if n_body else []
        scores.append(q @ mx.swapaxes(mx.expand_dims(res_k, 2), -1, -2))
        masks = [self._body_mask(n_body)] if n_body else []
        masks.append(residual_mask(self.residual, L))
        joined = mx.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0]
        if any(m is not None for m in masks):
            full = [
                mx.broadcast_to(mx.array(True) if m is None else m, (1, n_kv, L, s.shape[-1]))
                for m, s in zip(masks, scores, strict=True)
            ]
            mask = mx.expand_dims(mx.concatenate(full, axis=-1), 2)  # [1, H, 1, L, n]: one per GQA group
            joined = mx.where(mask, joined, mx.finfo(joined.dtype).min)
        weights = mx.softmax(joined, axis=-1, precise=True)
        out = weights[..., n_body:] @ mx.expand_dims(res_v, 2)
        if n_body:
            out = out + quantized_or_float_matmul(
                weights[..., :n_body], body_v, False, group, vb, mode, rot, sim
            )
        return mx.reshape(out, (B, n_q_heads, L, D))

    def _body_mask(self, n_body: int) -> mx.array | None:
        """[1, H, 1, n_body] padding mask of a ragged body (None when every head keeps the same count)."""
        if not self.body.is_ragged:
            return None
        counts = np.asarray(self.body.kept_counts)
        return mx.array(np.arange(n_body)[None, :] < counts[:, None])[None, :, None, :]


def residual_mask(residual: SparseKVCache, n_queries: int) -> mx.array | None:
    """[1, H or 1, n_queries, n_rows] bool over the residual's rows: its padding off (ragged) and the new tokens
    causal among themselves; None when every row is visible (one new token, equal counts)."""
    mask = residual.per_head_mask(n_queries)
    if mask is not None or n_queries == 1:
        return mask
    n = residual.size()
    return (mx.arange(n - n_queries, n)[:, None] >= mx.arange(n)[None])[None, None]


def _per_head(sel: Any, n_heads: int) -> list[np.ndarray]:
    """One layer's selection (1-D shared, 2-D per head or a list of per-head arrays) as H_kv int arrays."""
    if isinstance(sel, list):
        return [np.asarray(s, dtype=np.int64) for s in sel]
    arr = np.asarray(sel, dtype=np.int64)
    return [arr] * n_heads if arr.ndim == 1 else list(arr)


def split_select(
    fp_cache: Sequence[Any],
    packed_cache: Sequence[Any],
    selection: Sequence[Any],
    n_prompt: int,
    n_sink: int,
    fp_recent: int,
) -> list[Any]:
    """Per layer the kept positions of `selection` (kvcore.methods.selection's form, rows of the dense prefill): the
    sinks and the last `fp_recent` of the `n_prompt` positions gathered from the float cache, the rest from the
    packed copy of the same prefill (kvcore.cache.sparse.quantize_cache of it). Layers with no selection pass through
    as the packed copy has them. Everything is evaluated in one `mx.eval`."""
    out: list[Any] = list(packed_cache)
    for i, sel in enumerate(selection):
        if sel is None:
            continue
        heads = _per_head(sel, packed_cache[i].n_heads)
        in_residual = [(p < n_sink) | (p >= n_prompt - fp_recent) for p in heads]
        body = take_rows(packed_cache[i], [p[~r] for p, r in zip(heads, in_residual, strict=True)])
        residual = take_rows(fp_cache[i], [p[r] for p, r in zip(heads, in_residual, strict=True)])
        out[i] = ResidualKVCache(body, residual)
    mx.eval(
        [
            a
            for c in out
            if isinstance(c, ResidualKVCache)
            for store in (c.body, c.residual)
            for side in store.keys_and_values()
            for a in (side if isinstance(side, tuple) else (side,))
        ]
    )
    return out
