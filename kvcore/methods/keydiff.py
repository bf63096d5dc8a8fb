"""keydiff (Park et al. 2025, kvpress's KeyDiffPress): keep the keys least like the layer's average key.

Per kv-head, the anchor is the mean of the L2-normalised keys over the prompt; a key's score is minus its cosine
similarity to that anchor, so distinctive keys rank first. Needs no queries: the same positions whatever is asked.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvcore.capture.prefill import LayerObservation
from kvcore.methods.base import Method

#: torch's F.normalize and F.cosine_similarity floor the norms at this, so a zero key scores 0, not NaN.
_EPS_NORMALIZE, _EPS_COSINE = 1e-12, 1e-8


@dataclass(frozen=True)
class KeyDiff(Method):
    name = "keydiff"
    description = "Keys least similar (cosine) to the mean normalised key: distinctive keys are kept"
    paper = (
        "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in Resource-"
        "Constrained Environments (Park et al. 2025), arXiv:2504.15364"
    )
    scores_from_cache = True

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        keys = obs.keys.astype(mx.float32)  # [H_kv, T, D]
        norms = mx.sqrt((keys * keys).sum(axis=-1, keepdims=True))
        anchor = (keys / mx.maximum(norms, _EPS_NORMALIZE)).mean(axis=1, keepdims=True)  # [H_kv, 1, D]
        anchor_norm = mx.sqrt((anchor * anchor).sum(axis=-1))
        cosine = (keys * anchor).sum(axis=-1) / mx.maximum(norms[..., 0] * anchor_norm, _EPS_COSINE)
        return -cosine
