"""random: a seeded, reproducible baseline that every real method should beat."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import param
from kvcore.defaults import DEFAULT_SEED
from kvcore.methods.base import Method


@dataclass(frozen=True)
class Random(Method):
    name = "random"
    description = "Seeded random positions: the floor every real method should beat"
    paper = "none: a baseline (kvpress's RandomPress)"

    seed: int = param(DEFAULT_SEED, "random seed (the same seed keeps the same positions)", minimum=0)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        """Uniform draws from default_rng([seed, layer]), stored as their ranks in (0, 1) so float32 has no ties."""
        shape = (obs.n_kv_heads, obs.n_tokens)
        draws = np.random.default_rng([self.seed, layer]).random(shape)
        ranks = draws.argsort(axis=1).argsort(axis=1)
        return mx.array(((ranks + 0.5) / obs.n_tokens).astype(np.float32))
