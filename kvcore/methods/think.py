"""think (Xu et al. 2024, "ThinK: thinner key cache by query-driven pruning"), as kvpress's ThinKPress defines it,
over the positions another method keeps (kvpress's `ComposedPress([SnapKVPress, ThinKPress])`).

Per layer and kv-head, channel c of the keys scores mean_w(q_c²) · mean_t(k_c²): the last `think_window` prompt
queries (post-RoPE, mean over the GQA group) against the keys the inner method kept. The int(D ·
`key_channel_compression_ratio`) lowest channels are pruned. kvpress zeroes them; KV Lens stores the kept rows'
keys without them (`kvcore.cache.channel_pruned`), so the memory really shrinks; attention is the same. Named
`think-INNER`; bare `think` is over snapkv. Default ratio 0.5: kvpress's default (0.0) prunes nothing; its own
example composes ThinKPress(0.5).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache.channel_pruned import prune_channels
from kvcore.cache.sparse import SparseKVCache
from kvcore.capture.prefill import LayerObservation
from kvcore.declared import param
from kvcore.defaults import CAPTURE_WINDOW
from kvcore.methods.base import Method
from kvcore.methods.snapkv import SnapKV
from kvcore.methods.wrapper import Wrapper, store_refusal

THINK_RATIO = 0.5
THINK_WINDOW = 32


def channel_scores(obs: LayerObservation, kept_keys: Sequence[np.ndarray], window: int) -> np.ndarray:
    """[H_kv, D]: mean over the last `window` queries of q², GQA-group mean, times each head's mean k² over its
    kept keys (`kept_keys[h]` [n_h, D])."""
    w = min(window, obs.n_tokens, obs.window_queries.shape[1])
    q = np.array(obs.window_queries[:, -w:].astype(mx.float32))  # [H_q, w, D]
    q_norm = (q**2).mean(axis=1).reshape(obs.n_kv_heads, obs.group, -1).mean(axis=1)
    k_norm = np.stack([(k.astype(np.float32) ** 2).mean(axis=0) for k in kept_keys])
    return q_norm * k_norm


def kept_channels(scores: np.ndarray, ratio: float) -> np.ndarray:
    """[H_kv, D − int(D·ratio)] sorted: every channel but the int(D·ratio) lowest-scoring of each head."""
    n_heads, head_dim = scores.shape
    pruned = np.argsort(scores, axis=1, kind="stable")[:, : int(head_dim * ratio)]
    keep = np.ones_like(scores, dtype=bool)
    np.put_along_axis(keep, pruned, False, axis=1)
    return np.stack([np.flatnonzero(row) for row in keep]).astype(np.int32)


@dataclass(frozen=True)
class ThinK(Wrapper):
    name = "think"
    description = (
        "ThinK (Xu et al. 2024): the inner method's positions, each head's keys stored without the channels of "
        "least query-key magnitude"
    )
    paper = "ThinK: Thinner Key Cache by Query-Driven Pruning (Xu et al. 2024), arXiv:2407.21018"
    wraps = True
    default_inner = "snapkv"

    inner: Method = dataclasses.field(default_factory=SnapKV)
    key_channel_compression_ratio: float = param(
        THINK_RATIO, "share of each head's key channels pruned (stored narrower)", minimum=0.0, maximum=0.99
    )
    think_window: int = param(
        THINK_WINDOW,
        "ThinK's window: the last prompt queries that score the channels",
        minimum=1,
        maximum=CAPTURE_WINDOW,
    )

    @classmethod
    def refusal(cls, inner: type[Method]) -> str | None:
        """A per-head scorer, kvzip's global eviction included: only what is stored changes."""
        return store_refusal(cls.name, inner)

    def store(self, cache: list[Any], model: Any, observations: Any = ()) -> list[Any]:
        """Each compressed layer's keys without its pruned channels (`kvcore.cache.channel_pruned`)."""
        cache = self.inner.store(cache, model, observations)
        if self.key_channel_compression_ratio == 0:
            return cache
        out = list(cache)
        for i, (layer, obs) in enumerate(zip(cache, observations, strict=False)):
            if obs is None:
                continue
            if obs.latent:
                raise ValueError("think prunes per-head key channels: not on latent (MLA) layers")
            if type(layer) is not SparseKVCache:
                raise ValueError(
                    f"think stores narrow float keys: turn quantization off (layer {i} is packed)"
                )
            keys, _ = layer.keys_and_values()
            rows = np.array(keys[0].astype(mx.float32))  # [H_kv, n, D]
            counts = layer.kept_counts
            scores = channel_scores(
                obs, [rows[h, : counts[h]] for h in range(rows.shape[0])], self.think_window
            )
            out[i] = prune_channels(layer, kept_channels(scores, self.key_channel_compression_ratio))
        return out
