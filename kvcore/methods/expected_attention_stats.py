"""expected_attention_stats (kvpress's ExpectedAttentionStatsPress): expected_attention with the query mean and
covariance of a calibration set instead of the prompt's own.

The statistics are those of the pre-RoPE queries of every query head at positions ≥ 4 of each calibration prompt
(kvpress's n_sink at collection), covariance with the unbiased n − 1; scoring is expected_attention's: R̄ of the
prompt's future positions, softmax of k·μ'/√d + kᵀΣ'k/(2d) over the non-sink keys, mean over the GQA group, times
‖v‖₂. kvpress downloads statistics for a few models; `kvlens calibrate expected_attention_stats --model M
--prompts DIR` computes them for any model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.defaults import DEFAULT_N_SINK
from kvcore.methods.base import Method, n_sink_param
from kvcore.methods.calibration import Artifact
from kvcore.methods.expected_attention import scores_from_moments


@dataclass(frozen=True)
class ExpectedAttentionStats(Method):
    name = "expected_attention_stats"
    description = "expected_attention with the query statistics of a calibration set (calibrated per model)"
    paper = (
        "Expected Attention: KV Cache Compression by Estimating Attention from Future Queries Distribution "
        "(Devoto et al. 2025), arXiv:2510.00636"
    )
    needs_query_stats = True  # for R̄ (the layer's rope module) only
    calibration: ClassVar[str] = "expected_attention_stats"
    calibration_skip: ClassVar[int] = DEFAULT_N_SINK

    n_sink: int = n_sink_param()
    artifact: Any = dataclasses.field(default=None, compare=False, repr=False)
    artifact_digest: str = dataclasses.field(default="", repr=False)

    def with_artifact(self, artifact: Artifact) -> ExpectedAttentionStats:
        return dataclasses.replace(self, artifact=artifact, artifact_digest=artifact.digest)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        if self.artifact is None:
            raise ValueError(
                "expected_attention_stats needs its calibration: run "
                "`kvlens calibrate expected_attention_stats --model M --prompts DIR`"
            )
        stats = obs.query_stats
        rot = None if stats is None else stats.mean_rotation()
        if obs.latent or rot is None or obs.values is None:
            raise ValueError(
                "expected_attention_stats needs the layer's rope module recorded at prefill (not MLA): prefill "
                "again, or choose another method for this model"
            )
        n_sink = min(self.n_sink, obs.n_tokens)
        if n_sink >= obs.n_tokens:
            return mx.ones((obs.n_kv_heads, obs.n_tokens), mx.float32)
        mean = mx.array(self.artifact.mean(layer).astype(np.float32))
        cov = mx.array(self.artifact.covariance(layer).astype(np.float32))
        return scores_from_moments(obs, n_sink, mean, cov, rot)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return np.arange(min(self.n_sink, n_tokens))
