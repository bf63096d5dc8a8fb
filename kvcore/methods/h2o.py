"""h2o (Zhang et al. 2023): heavy hitters by observed attention from every prompt query."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, group_mean


@dataclass(frozen=True)
class H2O(Method):
    name = "h2o"
    description = "Heavy hitters: the keys every prompt query attended to most, per query that could see them"
    paper = (
        "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models (Zhang et al. "
        "2023), arXiv:2306.14048"
    )
    needs_h2o = True

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        """Column sums / (T - t): average attention per query that can see key t, so early keys aren't favoured."""
        if obs.h2o_sums is None:
            raise ValueError("h2o needs the column sums recorded at prefill: capture with h2o=True")
        n_tokens = obs.n_tokens
        seen_by = mx.arange(n_tokens, 0, -1, dtype=mx.float32)
        return group_mean(obs.h2o_sums / seen_by, obs.n_kv_heads)
