"""qfilter (Godey et al. 2025, Q-Filters; kvpress's QFilterPress): keys scored against each head's principal query
direction, found once per model by calibration.

Per layer and kv-head, the filter is the first right singular vector of the stacked pre-RoPE queries of its query
heads over the calibration prompts — the top eigenvector of Σ q qᵀ, which the artifact's running statistics give
exactly — signed so the mean query projects positively on it. A key's score is −⟨k, filter⟩ (kvpress's
definition): queries mostly point along the filter, so a key far against it draws little attention and goes first.
kvpress scores the cached keys (after RoPE) with its downloaded filters, and so does `post_rope_keys=1` (the
default, parity); `post_rope_keys=0` scores the keys before RoPE, the space the filter was calibrated in.
kvpress downloads filters for a few models; `kvlens calibrate qfilter --model M --prompts DIR` computes them for any.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method, param
from kvcore.methods.calibration import Artifact
from kvcore.methods.pre_rope import pre_rope_keys


def query_filters(artifact: Artifact, layer: int, n_kv_heads: int) -> np.ndarray:
    """[H_kv, D] float64: the principal direction of each kv-head's calibration queries, mean projection ≥ 0."""
    second = artifact.second_moment(layer)  # [H_q, D, D]
    n_q, head_dim = second.shape[0], second.shape[-1]
    grouped = second.reshape(n_kv_heads, n_q // n_kv_heads, head_dim, head_dim).sum(axis=1)
    _, vectors = np.linalg.eigh(grouped)
    filters = vectors[:, :, -1]  # eigh sorts ascending: the last column is the principal direction
    mean = artifact.mean(layer).reshape(n_kv_heads, -1, head_dim).mean(axis=1)
    sign = np.where((filters * mean).sum(axis=-1) < 0, -1.0, 1.0)
    return filters * sign[:, None]


@dataclass(frozen=True)
class QFilter(Method):
    name = "qfilter"
    description = "Keys against each head's principal query direction (calibrated per model): −⟨k, filter⟩"
    paper = (
        "Q-Filters: Leveraging QK Geometry for Efficient KV Cache Compression (Godey et al. 2025), "
        "arXiv:2503.02812"
    )
    calibration: ClassVar[str] = "qfilter"
    calibration_skip: ClassVar[int] = 0  # every prompt position's query counts
    scores_from_cache = (
        True  # only the keys (and the artifact): chunks and a chain's later stages may score slices
    )

    post_rope_keys: int = param(
        1, "1: score the cached keys (after RoPE), as kvpress; 0: the keys before RoPE", minimum=0, maximum=1
    )
    artifact: Any = dataclasses.field(default=None, compare=False, repr=False)
    artifact_digest: str = dataclasses.field(default="", repr=False)

    def with_artifact(self, artifact: Artifact) -> QFilter:
        return dataclasses.replace(self, artifact=artifact, artifact_digest=artifact.digest)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        if self.artifact is None:
            raise ValueError(
                "qfilter needs its calibration: run `kvlens calibrate qfilter --model M --prompts DIR`"
            )
        if obs.latent:
            raise ValueError(
                "qfilter does not score multi-head latent attention (MLA) layers: choose another method"
            )
        keys = (
            obs.keys.astype(mx.float32) if self.post_rope_keys else pre_rope_keys(obs, self.name)
        )  # [H_kv, T, D]
        filters = mx.array(query_filters(self.artifact, layer, obs.n_kv_heads).astype(np.float32))
        return -(keys * filters[:, None, :]).sum(axis=-1)
