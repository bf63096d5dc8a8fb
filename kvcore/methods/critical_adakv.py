"""critical_adakv (Feng et al. 2025): criticalkv's two stages inside adakv's head-wise budgets.

As kvpress's CriticalAdaKVPress: each kv-head keeps its inner top max(1, int(alpha·n)); the layer's H·n slots go
to the best inner scores across heads (adakv's budgets); in each head, int(budget·first_stage_ratio) are kept on
the inner scores, the rest by (score + epsilon)·‖W_o·v‖₁ (`kvcore.methods.criticalkv`). The Score view shows each
head's final priority (`final_scores`): its top budget(h) positions are what the head keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import param
from kvcore.defaults import ADAKV_ALPHA
from kvcore.methods.base import Pick
from kvcore.methods.criticalkv import (
    EPSILON,
    FIRST_STAGE_RATIO,
    final_priority,
    second_stage,
    value_output_norms,
)
from kvcore.methods.wrapper import Wrapper, padded_scores


@dataclass(frozen=True)
class CriticalAdaKV(Wrapper):
    name = "critical_adakv"
    description = "criticalkv's two stages with adakv's budgets spread over the kv-heads"
    paper = (
        "Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective (Feng et al. "
        "2025), arXiv:2502.03805"
    )
    default_inner = "snapkv"
    budget = "uniform"
    chooses = True
    spreads_over_heads = True

    alpha: float = param(
        ADAKV_ALPHA, "safeguard: the share of the mean budget every head keeps", minimum=0.0, maximum=1.0
    )
    epsilon: float = param(EPSILON, "added to the scores before they are scaled by ‖W_o·v‖₁", minimum=0.0)
    first_stage_ratio: float = param(
        FIRST_STAGE_RATIO,
        "share of each head's budget kept on the inner scores alone",
        minimum=0.0,
        maximum=1.0,
    )

    def auxiliary(self, obs: LayerObservation, layer: int) -> mx.array:
        return value_output_norms(obs, self.label)

    def ranked_by(self, pick: Pick) -> tuple[np.ndarray, list[int]]:
        """One layer's final priority [H_kv, T] and each head's budget (adakv's, from the inner scores)."""
        n_heads, n_tokens = pick.scores.shape
        scores = padded_scores(pick.scores, self.inner.always_kept(n_tokens))
        n = min(pick.n, n_tokens)
        safe = int(n * self.alpha)
        if self.alpha > 0:
            safe = max(1, safe)
        by_head = np.argsort(-scores, axis=1, kind="stable")
        priority = scores.astype(np.float64)
        np.put_along_axis(priority, by_head[:, :safe], np.inf, axis=1)
        best = np.argsort(-priority.ravel(), kind="stable")[: n * n_heads]
        budgets = np.bincount(best // n_tokens, minlength=n_heads).tolist()
        order = np.argsort(-priority, axis=1, kind="stable")
        first = [order[h, : max(safe, int(b * self.first_stage_ratio))] for h, b in enumerate(budgets)]
        assert pick.auxiliary is not None
        return final_priority(scores, pick.auxiliary, first, self.epsilon), budgets

    def final_scores(self, pick: Pick) -> np.ndarray:
        return self.ranked_by(pick)[0]

    def choose(self, pick: Pick) -> list[np.ndarray]:
        return second_stage(*self.ranked_by(pick))
