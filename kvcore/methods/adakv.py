"""adakv (Feng et al. 2024): any per-head scorer, with the layer's budget spread unevenly over its kv-heads.

The scores are the wrapped method's; what changes is the allocation (`kvcore.methods.budgets.adakv_counts`), so the
heads whose attention is concentrated give positions to the heads that need them. Named `adakv-INNER`
(`adakv-h2o`); bare `adakv` wraps snapkv.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import Parameter, param
from kvcore.defaults import ADAKV_ALPHA
from kvcore.methods.base import Method
from kvcore.methods.snapkv import SnapKV


@dataclass(frozen=True)
class AdaKV(Method):
    name = "adakv"
    description = "Any per-head scorer, with each layer's budget spread over its kv-heads by their scores"
    paper = (
        "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient LLM Inference (Feng"
        " et al. 2024), arXiv:2407.11550"
    )
    spreads_over_heads = True
    wraps = True
    default_inner = "snapkv"

    inner: Method = dataclasses.field(default_factory=SnapKV)
    alpha: float = param(
        ADAKV_ALPHA, "safeguard: the share of the mean budget every head keeps", minimum=0.0, maximum=1.0
    )

    def __post_init__(self) -> None:
        inner = self.inner
        if inner.wraps or inner.keeps_everything or inner.shared_across_heads:
            raise ValueError(f"adakv needs a per-head scorer, got {inner.label!r}")
        super().__post_init__()

    @property
    def label(self) -> str:
        return f"{self.name}-{self.inner.label}"

    @property
    def budget(self) -> str:  # type: ignore[override]
        return self.inner.budget

    @property
    def needs_h2o(self) -> bool:  # type: ignore[override]
        return self.inner.needs_h2o

    @property
    def needs_query_stats(self) -> bool:  # type: ignore[override]
        return self.inner.needs_query_stats

    def parameters(self) -> tuple[Parameter, ...]:
        return (*self.inner.parameters(), *self.own_parameters())

    def values(self) -> dict[str, int | float]:
        return {**self.inner.values(), **super().values()}

    def with_values(self, **values: int | float) -> Method:
        self.check_names(values)
        own = {p.name for p in self.own_parameters()}
        theirs = {k: v for k, v in values.items() if k not in own}
        inner = self.inner.with_values(**theirs) if theirs else self.inner
        return dataclasses.replace(self, inner=inner, **{k: v for k, v in values.items() if k in own})

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        return self.inner.scores(obs, layer)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return self.inner.always_kept(n_tokens)

    def at_ratio(self, ratio: float) -> Method:
        """kvpress's AdaKVPress hands its compression ratio to the press it wraps (compactor's blending)."""
        inner = self.inner.at_ratio(ratio)
        return self if inner is self.inner else dataclasses.replace(self, inner=inner)
