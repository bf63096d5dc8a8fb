"""finch (Corallo & Papotti 2024, FINCH: prompt-guided KV cache compression; kvpress's FinchPress).

SnapKV's vote with the question as the window: the prompt is context + question, and the question's `window`
tokens (kvpress finds them after a delimiter token) score the context. Each query's attention row is multiplied by
its position (FINCH's normalisation for the number of keys it sees), averaged over the window and the GQA group,
without pooling; the window is kept. Top n per kv-head (or per chunk of `selection_chunk`, kvpress's
chunk_length), then the kept keys are re-rotated to contiguous positions (`kvcore.methods.key_rerotation`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import param
from kvcore.methods.base import Method, Pick, effective_window, group_mean, window_attention, window_param
from kvcore.methods.key_rerotation import rerotate_cache
from kvcore.methods.wrapper import padded_scores


@dataclass(frozen=True)
class Finch(Method):
    name = "finch"
    description = (
        "The question (last `window` tokens) votes with position-normalised attention; keys re-rotated"
    )
    paper = (
        "FINCH: Prompt-guided Key-Value Cache Compression for Large Language Models (Corallo & Papotti, TACL "
        "2024), doi:10.1162/tacl_a_00716"
    )
    chooses = True

    window: int = window_param()
    normalize_scores: int = param(
        1, "1: each query's attention times its position (FINCH); 0: plain", minimum=0, maximum=1
    )
    selection_chunk: int = param(
        0, "0: one selection over the prompt; N: top of each chunk of N (kvpress: chunk_length)", minimum=0
    )
    rerotate_keys: int = param(
        1, "1: kept keys re-rotated to contiguous positions; 0: stored as they were", minimum=0, maximum=1
    )

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        w = effective_window(obs, self.window)
        n_before = obs.n_tokens - w
        attention = window_attention(obs, w)[:, :, :n_before]  # [H_q, w, T - w]
        if self.normalize_scores:
            attention = attention * mx.arange(n_before, obs.n_tokens, dtype=mx.float32)[None, :, None]
        votes = group_mean(attention.mean(axis=1), obs.n_kv_heads)
        return mx.concatenate([votes, mx.full((obs.n_kv_heads, w), votes.max() + 1, mx.float32)], axis=1)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return np.arange(n_tokens - 1, n_tokens - 1 - min(self.window, n_tokens), -1)

    def choose(self, pick: Pick) -> np.ndarray:
        n_heads, n_tokens = pick.scores.shape
        if not self.selection_chunk:
            return np.sort(pick.order[:, : pick.n], axis=1).astype(np.int32)
        if self.selection_chunk <= self.window / pick.ratio:
            raise ValueError(
                f"finch: selection_chunk {self.selection_chunk} must exceed window / ratio = {self.window / pick.ratio:g} "
                "(each chunk must hold more than the window it keeps): raise selection_chunk or use 0 (no chunks)"
            )
        scores = padded_scores(pick.scores, self.always_kept(n_tokens))
        kept = []
        for start in range(0, n_tokens, self.selection_chunk):
            part = scores[:, start : start + self.selection_chunk]
            n = max(1, int(part.shape[1] * (1 - (1 - pick.ratio))))
            kept.append(start + np.argsort(-part, axis=1, kind="stable")[:, :n])
        return np.sort(np.concatenate(kept, axis=1), axis=1).astype(np.int32)

    def store(self, cache: list[Any], model: Any, observations: Any = ()) -> list[Any]:
        return rerotate_cache(cache, model, self.name) if self.rerotate_keys else cache
