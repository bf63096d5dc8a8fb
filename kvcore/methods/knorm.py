"""knorm (Devoto et al. 2024): keys with a low L2 norm draw high attention, so keep them."""

from __future__ import annotations

import mlx.core as mx

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, MethodParams


class KNorm(Method):
    name = "knorm"

    def scores(self, obs: LayerObservation, layer: int, params: MethodParams) -> mx.array:
        keys = obs.keys.astype(mx.float32)
        return -mx.sqrt((keys * keys).sum(axis=-1))
