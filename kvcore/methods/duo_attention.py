"""duo_attention (Xiao et al. 2024, DuoAttention; kvpress's DuoAttentionPress with `on_the_fly_scoring`): retrieval
heads keep everything, streaming heads keep only the first `sink_size` and the last `recent_size` positions.

Which heads stream is decided from the prompt itself, no artifact: per layer, the mean pre-RoPE query of each query
head and the mean pre-RoPE key of each kv-head over the prompt are repeated at positions 0 … n_query_positions − 1
and rotated by the layer's own RoPE; the last of those queries attends (scale 1/√d) over those keys, and a head's
score is the area under its cumulative attention curve (mean of the cumulative sum), mean over the GQA group. A head
that looks at the recent past scores low. The share 1 − r of all (layer, kv-head) pairs with the lowest scores,
model-wide, stream (kvpress's `head_compression_ratio`); so the ratio sets the share of streaming heads, and the
cache keeps more than r·T on average, as in kvpress. kvpress computes the same score on 50 BookSum chapters; here
the prompt is the sample (kvpress's on-the-fly mode fed the prompt is what parity compares against).

Scores: the head's score at every position a streaming head would drop, 2 (above any head score) where it keeps.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import param
from kvcore.methods.base import Method
from kvcore.methods.budgets import check_ratio
from kvcore.methods.calibration import Artifact
from kvcore.methods.pre_rope import pre_rope_keys

#: kvpress's q_len: positions the mean query and key are repeated at.
DEFAULT_QUERY_POSITIONS = 500
#: The score of positions every head keeps: above any head score (a share of attention, at most 1).
PROTECTED = 2.0


def head_scores(obs: LayerObservation, n_positions: int) -> mx.array:
    """[H_kv]: area under the cumulative attention curve of the last of `n_positions` mean queries (module
    docstring); ValueError where the layer's pre-RoPE queries were not recorded."""
    keys = pre_rope_keys(obs, "duo_attention")  # also refuses MLA and untapped layers
    stats = obs.query_stats
    if stats is None:
        raise ValueError(
            "duo_attention needs the pre-RoPE query statistics recorded at prefill: prefill again with "
            "query_stats=True, or choose another method for this model"
        )
    _, mean_query, _ = stats.moments(0)  # [H_q, D] over every prompt position
    mean_key = keys.mean(axis=1)  # [H_kv, D]
    head_dim = mean_key.shape[-1]
    repeated = mx.broadcast_to(mean_key[None, :, None], (1, obs.n_kv_heads, n_positions, head_dim))
    rotated_keys = obs.rope(repeated, offset=0)[0]  # [H_kv, P, D]
    last_query = obs.rope(mean_query[None, :, None], offset=n_positions - 1)[0, :, 0]  # [H_q, D]
    q = last_query.reshape(obs.n_kv_heads, obs.group, head_dim)
    logits = (q @ rotated_keys.transpose(0, 2, 1)) / math.sqrt(head_dim)  # [H_kv, group, P]
    weights = mx.softmax(logits.astype(mx.float32), axis=-1, precise=True)
    return mx.cumsum(weights, axis=-1).mean(axis=-1).mean(axis=-1)


@dataclass(frozen=True)
class StreamingHeads(Method):
    """What duo_attention and duo_attention_calibrated share: the kept positions of a streaming head and the
    model-wide choice of streaming heads; they differ in where a head's score comes from."""

    sink_size: int = param(128, "first positions a streaming head keeps", minimum=0)
    recent_size: int = param(256, "last positions a streaming head keeps", minimum=1)

    def protected(self, n_tokens: int, per_head: mx.array) -> mx.array:
        """[H_kv, T]: PROTECTED where a streaming head keeps (sinks, recent), the head's score [H_kv, 1] elsewhere."""
        position = mx.arange(n_tokens)
        kept = (position < self.sink_size) | (position >= n_tokens - self.recent_size)
        return mx.where(kept[None], PROTECTED, per_head).astype(mx.float32)

    def across_layers(self, scores: list[np.ndarray | None], ratio: float) -> list[list[np.ndarray] | None]:
        """The model's share 1 − r of (layer, kv-head) pairs with the lowest head scores stream; the rest keep all."""
        streaming = 1.0 - check_ratio(ratio)
        captured = [s for s in scores if s is not None]
        if not captured:
            return [None] * len(scores)
        per_head = np.stack([s.min(axis=1) for s in captured])  # [L', H_kv]: the head score (or PROTECTED)
        n_streaming = round(per_head.size * streaming)
        is_streaming = np.zeros(per_head.size, bool)
        is_streaming[np.argsort(per_head, axis=None, kind="stable")[:n_streaming]] = True
        is_streaming = is_streaming.reshape(per_head.shape)
        out: list[list[np.ndarray] | None] = []
        row = 0
        for s in scores:
            if s is None:
                out.append(None)
                continue
            everything = np.arange(s.shape[1], dtype=np.int32)
            out.append(
                [
                    np.flatnonzero(s[h] >= PROTECTED).astype(np.int32) if is_streaming[row, h] else everything
                    for h in range(s.shape[0])
                ]
            )
            row += 1
        return out


@dataclass(frozen=True)
class DuoAttention(StreamingHeads):
    name = "duo_attention"
    description = (
        "Retrieval heads keep everything, streaming heads (share 1 − r, by their attention on the recent past) "
        "keep sinks + recent"
    )
    paper = (
        "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming Heads (Xiao et al. "
        "2024), arXiv:2410.10819"
    )
    needs_query_stats = True

    n_query_positions: int = param(
        DEFAULT_QUERY_POSITIONS, "positions the mean query and key are repeated at to score a head", minimum=1
    )

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        return self.protected(obs.n_tokens, head_scores(obs, self.n_query_positions)[:, None])


@dataclass(frozen=True)
class DuoAttentionCalibrated(StreamingHeads):
    """duo_attention with each head's score averaged over calibration prompts (kvpress's on-the-fly scoring on its
    own sample set) instead of read from the prompt: `kvlens calibrate duo_attention_calibrated --prompts DIR`."""

    name = "duo_attention_calibrated"
    description = (
        "duo_attention with head scores averaged over a calibration set (calibrated per model): streaming heads "
        "keep sinks + recent"
    )
    paper = (
        "DuoAttention: Efficient Long-Context LLM Inference with Retrieval and Streaming Heads (Xiao et al. "
        "2024), arXiv:2410.10819"
    )
    calibration: ClassVar[str] = "duo_attention_calibrated"
    calibration_skip: ClassVar[int] = 0

    artifact: Any = dataclasses.field(default=None, compare=False, repr=False)
    artifact_digest: str = dataclasses.field(default="", repr=False)

    @staticmethod
    def calibration_sample(obs: LayerObservation) -> np.ndarray:
        """One calibration prompt's head scores [H_kv] (kvpress's 500 positions), float32."""
        return np.array(head_scores(obs, DEFAULT_QUERY_POSITIONS), np.float32)

    def with_artifact(self, artifact: Artifact) -> DuoAttentionCalibrated:
        return dataclasses.replace(self, artifact=artifact, artifact_digest=artifact.digest)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        if self.artifact is None or layer >= len(self.artifact.sums) or self.artifact.sums[layer] is None:
            raise ValueError(
                "duo_attention_calibrated needs its calibration of this model: run "
                "`kvlens calibrate duo_attention_calibrated --model M --prompts DIR`"
            )
        per_head = mx.array(self.artifact.sums[layer] / np.float32(self.artifact.n_prompts))[:, None]
        return self.protected(obs.n_tokens, per_head)
