"""knorm (Devoto et al. 2024): keys with a low L2 norm draw high attention, so keep them."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method


@dataclass(frozen=True)
class KNorm(Method):
    name = "knorm"
    description = "Keys with a low L2 norm draw high attention: keep the smallest keys"
    paper = (
        "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression (Devoto et al. 2024), "
        "arXiv:2406.11430"
    )
    scores_from_cache = True

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        keys = obs.keys.astype(mx.float32)
        return -mx.sqrt((keys * keys).sum(axis=-1))
