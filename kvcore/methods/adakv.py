"""adakv (Feng et al. 2024): any scorer, with the layer's budget spread unevenly over its kv-heads.

The scores are the wrapped method's; what changes is the allocation (`kvcore.methods.budgets.adakv_counts`), so the
heads whose attention is concentrated give positions to the heads that need them.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, MethodParams


class AdaKV(Method):
    name = "adakv"

    def __init__(self, inner: Method) -> None:
        if isinstance(inner, AdaKV) or inner.keeps_everything or inner.shared_across_heads:
            raise ValueError(f"adakv needs a per-head scorer, got {inner.name!r}")
        self.inner = inner
        self.needs_h2o = inner.needs_h2o
        self.budget = inner.budget
        self.max_n_sink = inner.max_n_sink
        self.needs_query_stats = inner.needs_query_stats

    def scores(self, obs: LayerObservation, layer: int, params: MethodParams) -> mx.array:
        return self.inner.scores(obs, layer, params)

    def always_kept(self, n_tokens: int, params: MethodParams) -> np.ndarray:
        return self.inner.always_kept(n_tokens, params)

    def __repr__(self) -> str:
        return f"AdaKV({self.inner!r})"
