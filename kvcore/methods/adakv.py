"""adakv (Feng et al. 2024): any per-head scorer, with the layer's budget spread unevenly over its kv-heads.

The scores are the wrapped method's; what changes is the allocation (`kvcore.methods.budgets.adakv_counts`), so the
heads whose attention is concentrated give positions to the heads that need them. Named `adakv-INNER`
(`adakv-h2o`); bare `adakv` wraps snapkv. What it passes on from its inner method is `Wrapper`'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvcore.declared import param
from kvcore.defaults import ADAKV_ALPHA
from kvcore.methods.base import Method
from kvcore.methods.wrapper import Wrapper


@dataclass(frozen=True)
class AdaKV(Wrapper):
    name = "adakv"
    description = "Any per-head scorer, with each layer's budget spread over its kv-heads by their scores"
    paper = (
        "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient LLM Inference (Feng"
        " et al. 2024), arXiv:2407.11550"
    )
    spreads_over_heads = True
    default_inner = "snapkv"

    alpha: float = param(
        ADAKV_ALPHA, "safeguard: the share of the mean budget every head keeps", minimum=0.0, maximum=1.0
    )

    def at_ratio(self, ratio: float) -> Method:
        """kvpress's AdaKVPress hands its compression ratio to the press it wraps (compactor's blending)."""
        inner = self.inner.at_ratio(ratio)
        return self if inner is self.inner else dataclasses.replace(self, inner=inner)
