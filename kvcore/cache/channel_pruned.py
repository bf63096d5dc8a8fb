"""Keys stored without their pruned channels (ThinK): each kv-head keeps its own `channels` of the key's head_dim.

ThinK (Xu et al. 2024) drops the key channels whose query-key magnitude is smallest. kvpress zeroes them (no memory
saved); here the kept prompt rows are stored narrow, `[1, H_kv, n, d_kept]` keys beside full `[1, H_kv, n, D]`
values, so the bytes are those of the arrays held. A zeroed channel adds nothing to q·k, so attention over the
narrow keys with each query's same channels gathered equals attention over the zeroed full keys (the scale stays
the model's 1/√D). Tokens appended after compression (decode) go to a full-width float store, as kvpress keeps
decoded keys whole; attention joins both stores' scores before one softmax, as `kvcore.cache.residual` does.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache.residual import residual_mask, two_part_mask
from kvcore.cache.sparse import SparseKVCache, copy_cache

__all__ = ["ChannelPrunedKVCache", "prune_channels"]


class ChannelPrunedKVCache:
    """The prompt's kept rows with narrow keys (`body`, never appended to) and the decoded tokens (`recent`).

    mlx-lm's models read `offset` (RoPE), call `update_and_fetch` and hand what it returns to the attention
    function; `kvcore.model.attention.sdpa` sees `attend` and calls it.
    """

    def __init__(self, body: SparseKVCache, recent: SparseKVCache, channels: mx.array) -> None:
        self.body, self.recent, self.channels = body, recent, channels  # channels [H_kv, d_kept] int32

    @property
    def offset(self) -> int:
        return self.recent.offset

    @property
    def keys(self) -> Any:
        return self.recent.keys

    @property
    def n_heads(self) -> int:
        return self.body.n_heads

    @property
    def nbytes(self) -> int:
        """Both stores' rows (padding included): the narrow keys count at their narrow width."""
        return self.body.nbytes + self.recent.nbytes

    @property
    def kept_counts(self) -> np.ndarray:
        return self.body.kept_counts + self.recent.kept_counts

    @property
    def retained_positions(self) -> list[np.ndarray]:
        return [
            np.concatenate([a, b])
            for a, b in zip(self.body.retained_positions, self.recent.retained_positions, strict=True)
        ]

    def size(self) -> int:
        return self.body.size() + self.recent.size()

    def empty(self) -> bool:
        return False

    def is_trimmable(self) -> bool:
        return False

    def branch(self) -> ChannelPrunedKVCache:
        """An independent copy (`kvcore.cache.sparse.copy_cache` calls it)."""
        body, recent = copy_cache([self.body, self.recent])
        return ChannelPrunedKVCache(body, recent, self.channels)

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Any:
        """As a sparse layer's: None for one new token, "causal" for several (attend builds its own masks)."""
        return two_part_mask(self.size(), N, return_array, window_size, "channel-pruned")

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        """New tokens join the full-width store; returns (body keys, recent keys), (body values, recent values)."""
        recent_k, recent_v = self.recent.update_and_fetch(keys, values)
        body_k, body_v = self.body.keys_and_values()
        return (body_k, recent_k), (body_v, recent_v)

    def attend(self, queries: mx.array, keys: Any, values: Any, scale: float) -> mx.array:
        """Softmax attention over the narrow body and the full recent rows at once."""
        (body_k, recent_k), (body_v, recent_v) = keys, values
        B, n_q_heads, L, D = queries.shape
        n_kv = recent_k.shape[1]
        rep = n_q_heads // n_kv
        q = mx.reshape(queries * scale, (B, n_kv, rep, L, D))
        d_kept = self.channels.shape[1]
        index = mx.broadcast_to(self.channels[None, :, None, None, :], (B, n_kv, rep, L, d_kept))
        q_narrow = mx.take_along_axis(q, index, axis=-1)
        n_body = body_k.shape[2]
        scores = [q_narrow @ mx.swapaxes(mx.expand_dims(body_k, 2), -1, -2)] if n_body else []
        scores.append(q @ mx.swapaxes(mx.expand_dims(recent_k, 2), -1, -2))
        masks = [self._body_mask(n_body)] if n_body else []
        masks.append(residual_mask(self.recent, L))
        joined = mx.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0]
        if any(m is not None for m in masks):
            full = [
                mx.broadcast_to(mx.array(True) if m is None else m, (1, n_kv, L, s.shape[-1]))
                for m, s in zip(masks, scores, strict=True)
            ]
            mask = mx.expand_dims(mx.concatenate(full, axis=-1), 2)
            joined = mx.where(mask, joined, mx.finfo(joined.dtype).min)
        weights = mx.softmax(joined, axis=-1, precise=True)
        out = weights[..., n_body:] @ mx.expand_dims(recent_v, 2)
        if n_body:
            out = out + weights[..., :n_body] @ mx.expand_dims(body_v, 2)
        return mx.reshape(out, (B, n_q_heads, L, -1))

    def _body_mask(self, n_body: int) -> mx.array | None:
        if not self.body.is_ragged:
            return None
        counts = np.asarray(self.body.kept_counts)
        return mx.array(np.arange(n_body)[None, :] < counts[:, None])[None, :, None, :]


def prune_channels(layer: SparseKVCache, channels: np.ndarray) -> ChannelPrunedKVCache:
    """`layer`'s kept rows with only `channels` [H_kv, d_kept] (sorted per head) of each head's keys stored."""
    idx = mx.array(np.asarray(channels, np.int32))
    keys, values = layer.keys_and_values()
    n_heads, n_rows = keys.shape[1], keys.shape[2]
    gather = mx.broadcast_to(idx[None, :, None, :], (1, n_heads, n_rows, idx.shape[1]))
    narrow = mx.contiguous(mx.take_along_axis(keys, gather, axis=-1))
    body = SparseKVCache()
    body._set_rows(narrow, mx.contiguous(values), layer._selection, layer._prefix_counts, layer.offset)
    body._selection_np = layer._selection_np
    recent = SparseKVCache()
    recent._set_rows(
        keys[:, :, :0], values[:, :, :0], mx.zeros((n_heads, 0), mx.int32), np.zeros(n_heads), layer.offset
    )
    mx.eval(narrow, body.values)
    return ChannelPrunedKVCache(body, recent, idx)
