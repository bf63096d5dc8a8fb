"""simlayerkv (Zhang et al. 2024, SimLayerKV): "lazy" layers keep only the first and the most recent positions.

A layer is lazy when its last `n_last` prompt queries put more than `lazy_threshold` of their attention (mean over
query heads and those queries) on the first `n_initial` and the last `n_recent` positions before them; a lazy layer
keeps positions [0, n_initial) and the last n_recent − n_last, every other layer keeps everything. The run's ratio
does not apply: the threshold decides (1.0, kvpress's default, compresses nothing). kvpress's SimLayerKVPress.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import param
from kvcore.defaults import CAPTURE_WINDOW
from kvcore.methods.base import Method, Pick, effective_window, window_attention


@dataclass(frozen=True)
class SimLayerKV(Method):
    name = "simlayerkv"
    description = "Lazy layers (attention on the first and recent tokens above a threshold) keep only those"
    paper = (
        "SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction (Zhang et al. 2024), "
        "arXiv:2410.13846"
    )
    shared_across_heads = True
    chooses = True

    lazy_threshold: float = param(
        1.0,
        "a layer is lazy above this attention share on initial + recent tokens (1: none)",
        minimum=0.0,
        maximum=1.0,
    )
    n_last: int = param(1, "last prompt queries whose attention decides", minimum=1, maximum=CAPTURE_WINDOW)
    n_recent: int = param(1024, "recent positions a lazy layer keeps (n_recent − n_last of them)", minimum=1)
    n_initial: int = param(4, "initial positions (sinks) a lazy layer keeps", minimum=0)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        """The attention of the last n_last queries on each earlier position (mean over heads and queries): the
        layer is lazy when the first n_initial and last n_recent of these sum above the threshold."""
        w = effective_window(obs, self.n_last)
        weights = window_attention(obs, w)[:, :, : obs.n_tokens - w].mean(axis=(0, 1))
        row = mx.concatenate([weights, mx.zeros((w,), mx.float32)])
        return mx.broadcast_to(row[None], (obs.n_kv_heads, obs.n_tokens))

    def lazy(self, attention: np.ndarray, n_tokens: int) -> bool:
        """Whether a layer with these attention weights (scores' first row) is lazy."""
        if self.lazy_threshold == 1.0 or n_tokens <= self.n_initial + self.n_recent + self.n_last:
            return False
        before = attention[: n_tokens - self.n_last].astype(np.float64)
        share = before[: self.n_initial].sum() + before[-self.n_recent :].sum()
        return bool(share > self.lazy_threshold)

    def choose(self, pick: Pick) -> np.ndarray:
        n_tokens = pick.scores.shape[1]
        if not self.lazy(pick.scores[0], n_tokens):
            return np.arange(n_tokens, dtype=np.int32)
        recent = np.arange(n_tokens - self.n_recent + self.n_last, n_tokens)
        return np.concatenate([np.arange(self.n_initial), recent]).astype(np.int32)
