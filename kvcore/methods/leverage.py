"""leverage (Chari & Van Durme 2025, Compactor; kvpress's LeverageScorePress): statistical leverage of each key.

Per kv-head, the pre-RoPE keys are centred over the prompt and sketched on the right, X = (K − K̄)Φ with Φ a
[D, sketch_dimension] Gaussian matrix / √sketch_dimension; a key's score is its leverage x_tᵀ(XᵀX + 0.01·I)⁻¹x_t
(Cholesky, kvpress's first jitter), clamped at 0, then z-scored over every head of the layer (one mean, one
unbiased std floored at 1e-6). Outlying keys, those the rest of the prompt cannot span, rank first; no query is read.

kvpress draws Φ from torch's global generator at every call, so its choice is not reproducible; here Φ comes from
NumPy's generator seeded by (sketch_seed, layer): the same positions on every run, and the same Φ can be handed to
kvpress (benchmarks/kvpress_reference.py does) to compare the rest of the definition exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, param
from kvcore.methods.pre_rope import pre_rope_keys

#: kvpress's first Cholesky jitter: XᵀX + JITTER·I is positive definite, so it is the one ever used.
JITTER = 1e-2
_STD_FLOOR = 1e-6


def sketch(seed: int, layer: int, n_kv_heads: int, head_dim: int, width: int) -> np.ndarray:
    """Φ [H_kv, D, width] float32: standard normal / √width from NumPy's generator seeded by (seed, layer)."""
    rng = np.random.default_rng([seed, layer])
    # float32 draws times float32 1/√width, as kvpress scales torch's draws
    return rng.standard_normal((n_kv_heads, head_dim, width)).astype(np.float32) * np.float32(
        1 / math.sqrt(width)
    )


def leverage_scores(keys: mx.array, phi: mx.array) -> mx.array:
    """Approximate leverage [H, T] of the rows of `keys` [H, T, D] under the right sketch `phi` [H, D, k]."""
    x = (keys - keys.mean(axis=1, keepdims=True)) @ phi  # [H, T, k]
    gram = x.transpose(0, 2, 1) @ x
    gram = 0.5 * (gram + gram.transpose(0, 2, 1)) + JITTER * mx.eye(gram.shape[-1])
    # Linear algebra runs on the CPU stream in MLX. diag(X G⁻¹ Xᵀ) = ‖L⁻¹xₜ‖² with G = LLᵀ.
    lower = mx.linalg.cholesky(gram, stream=mx.cpu)
    solved = mx.linalg.solve_triangular(lower, x.transpose(0, 2, 1), upper=False, stream=mx.cpu)  # [H, k, T]
    return mx.maximum((solved * solved).sum(axis=1), 0.0)


def z_scored(scores: mx.array) -> mx.array:
    """(s − mean) / max(std, 1e-6) over every element (torch's unbiased std), as kvpress normalises a layer."""
    n = scores.size
    mean = scores.mean()
    std = mx.sqrt(((scores - mean) ** 2).sum() / max(n - 1, 1))
    return (scores - mean) / mx.maximum(std, _STD_FLOOR)


@dataclass(frozen=True)
class Leverage(Method):
    name = "leverage"
    description = "Statistical leverage of each pre-RoPE key under a Gaussian sketch: outlying keys are kept"
    paper = (
        "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage Scores (Chari & "
        "Van Durme 2025), arXiv:2507.08143"
    )

    sketch_dimension: int = param(48, "columns of the Gaussian sketch of the keys", minimum=1)
    sketch_seed: int = param(0, "seed of the sketch (NumPy's generator, with the layer index)", minimum=0)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        return z_scored(self.raw_scores(pre_rope_keys(obs, self.name), layer))

    def raw_scores(self, keys: mx.array, layer: int) -> mx.array:
        """Leverage [H_kv, T] of these pre-RoPE keys (before the z-score), with this layer's sketch."""
        n_kv_heads, _, head_dim = keys.shape
        phi = sketch(self.sketch_seed, layer, n_kv_heads, head_dim, self.sketch_dimension)
        return leverage_scores(keys, mx.array(phi))
