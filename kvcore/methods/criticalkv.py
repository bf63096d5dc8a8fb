"""criticalkv (Feng et al. 2025, "Identify Critical KV Cache in LLM Inference from an Output Perturbation
Perspective"): a pair matters as much as its attention and as much as its value moves the layer's output.

Two stages per kv-head, as kvpress's CriticalKVPress: the inner method's top int(r·T·first_stage_ratio) are kept
on its scores alone; the rest of the budget goes to the highest (score + epsilon)·‖W_o·v‖₁, the L1 norm of each
value through the head's slice of the output projection, averaged over the GQA group. The heatmap's Score view
shows that final ranking (`final_scores`: the rescaled scores, first-stage positions just above them); the norms
come from the layer's `o_proj` (reached through the observation).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import param
from kvcore.methods.base import Pick
from kvcore.methods.wrapper import Wrapper, padded_scores

EPSILON, FIRST_STAGE_RATIO = 1e-4, 0.5


def output_weight(proj: object) -> mx.array:
    """W_o [hidden, H_q·head_dim] as float32, dequantized when the projection is quantized."""
    weight = proj.weight  # type: ignore[attr-defined]
    if hasattr(proj, "scales"):
        weight = mx.dequantize(
            weight,
            proj.scales,  # type: ignore[attr-defined]
            getattr(proj, "biases", None),
            proj.group_size,  # type: ignore[attr-defined]
            proj.bits,  # type: ignore[attr-defined]
            mode=getattr(proj, "mode", "affine"),
        )
    return weight.astype(mx.float32)


def value_output_norms(obs: LayerObservation, name: str) -> mx.array:
    """‖W_o,h · v_t‖₁ per query head h, averaged over each GQA group: [H_kv, T]."""
    if obs.values is None or obs.output_proj is None:
        raise ValueError(
            f"{name} needs the layer's values and its attention output projection (self_attn.o_proj), which this "
            "model does not expose: choose a method without criticalkv"
        )
    values = obs.values.astype(mx.float32)  # [H_kv, T, D]
    head_dim = values.shape[-1]
    weight = output_weight(obs.output_proj)  # [hidden, H_q·D]
    per_head = weight.T.reshape(obs.n_q_heads, head_dim, -1)  # [H_q, D, hidden]
    norms = []
    for h in range(obs.n_q_heads):  # one head at a time: [T, hidden] each, as kvpress bounds its memory
        norms.append(mx.abs(values[h // obs.group] @ per_head[h]).sum(axis=-1))
    return mx.stack(norms).reshape(obs.n_kv_heads, obs.group, -1).mean(axis=1)


def final_priority(
    scores: np.ndarray, norms: np.ndarray, first: list[np.ndarray], epsilon: float
) -> np.ndarray:
    """[H_kv, T] float32: what the second stage ranks by, (score + epsilon)·norm, with each head's first-stage
    positions just above that head's highest value, so they come first and the Score view keeps a finite scale."""
    priority = (scores.astype(np.float32) + np.float32(epsilon)) * norms.astype(np.float32)
    for h, chosen in enumerate(first):
        if len(chosen):
            priority[h, chosen] = np.nextafter(priority[h].max(), np.float32(np.inf))
    return priority


def second_stage(priority: np.ndarray, budgets: list[int]) -> list[np.ndarray]:
    """Per head: the head's budget of highest priority (first-stage positions first; ties by position)."""
    return [
        np.sort(np.argsort(-row, kind="stable")[:n]).astype(np.int32)
        for row, n in zip(priority, budgets, strict=True)
    ]


@dataclass(frozen=True)
class CriticalKV(Wrapper):
    name = "criticalkv"
    description = "Inner scores, then the rest of the budget by score × ‖W_o·v‖₁ (output perturbation)"
    paper = (
        "Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective (Feng et al. "
        "2025), arXiv:2502.03805"
    )
    default_inner = "snapkv"
    budget = "uniform"
    chooses = True

    epsilon: float = param(EPSILON, "added to the scores before they are scaled by ‖W_o·v‖₁", minimum=0.0)
    first_stage_ratio: float = param(
        FIRST_STAGE_RATIO, "share of the budget kept on the inner scores alone", minimum=0.0, maximum=1.0
    )

    def auxiliary(self, obs: LayerObservation, layer: int) -> mx.array:
        return value_output_norms(obs, self.label)

    def ranked_by(self, pick: Pick) -> np.ndarray:
        """The final priority of one layer: inner top int(r·T·first_stage_ratio) first, then score × norm."""
        n_heads, n_tokens = pick.scores.shape
        scores = padded_scores(pick.scores, self.inner.always_kept(n_tokens))
        first = int((1 - (1 - pick.ratio)) * n_tokens * self.first_stage_ratio)
        if self.first_stage_ratio > 0:
            first = max(1, first)
        tops = [np.argsort(-scores[h], kind="stable")[:first] for h in range(n_heads)]
        assert pick.auxiliary is not None
        return final_priority(scores, pick.auxiliary, tops, self.epsilon)

    def final_scores(self, pick: Pick) -> np.ndarray:
        return self.ranked_by(pick)

    def choose(self, pick: Pick) -> np.ndarray:
        return np.stack(second_stage(self.ranked_by(pick), [pick.n] * pick.scores.shape[0]))
