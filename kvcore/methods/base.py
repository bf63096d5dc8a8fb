"""The one small protocol every compression method follows (kvpress's ScorerPress, reduced to what KV Lens needs).

A method turns one layer's `LayerObservation` into scores [H_kv, T] (higher = keep) and names the positions it
always keeps, in priority order. Ranking and budgets are shared (`kvcore.methods.selection`, `kvcore.methods.budgets`), so a
method is only its scores: that is what the heatmap shows and what the tests check against NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.defaults import DEFAULT_KERNEL, DEFAULT_N_SINK, DEFAULT_SEED, DEFAULT_WINDOW


@dataclass(frozen=True)
class MethodParams:
    """Hyper-parameters with the literature's defaults; validated on creation."""

    window: int = DEFAULT_WINDOW  # snapkv / pyramidkv observation window (queries)
    kernel: int = DEFAULT_KERNEL  # snapkv average-pooling kernel (odd)
    n_sink: int = DEFAULT_N_SINK  # streaming_llm attention sinks
    seed: int = DEFAULT_SEED  # random
    beta: int = 20  # pyramidkv steepness
    alpha: float = 0.2  # adakv per-head safeguard share

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an integer >= 1, got {self.window!r}")
        if not isinstance(self.kernel, int) or self.kernel < 1 or self.kernel % 2 == 0:
            raise ValueError(f"kernel must be an odd integer >= 1, got {self.kernel!r}")
        if not isinstance(self.n_sink, int) or self.n_sink < 0:
            raise ValueError(f"n_sink must be an integer >= 0, got {self.n_sink!r}")
        if not isinstance(self.beta, int | float) or self.beta < 1:
            raise ValueError(f"beta must be >= 1, got {self.beta!r}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha!r}")


class Method:
    """Base scorer. Subclasses set `name` and implement `scores`; the defaults suit most of them."""

    name: ClassVar[str] = ""
    budget: ClassVar[str] = "uniform"  # or "pyramidkv": per-layer counts from kvcore.methods.budgets
    shared_across_heads: ClassVar[bool] = False  # every kv-head keeps the same positions (tova)
    keeps_everything: ClassVar[bool] = False  # full: the ratio does not apply
    needs_h2o: ClassVar[bool] = False
    max_n_sink: ClassVar[int | None] = None  # the largest n_sink the captured statistics allow (None: any)
    needs_query_stats: ClassVar[bool] = (
        False  # pre-RoPE query statistics (kvcore.capture.query_stats): not on MLA
    )

    def scores(self, obs: LayerObservation, layer: int, params: MethodParams) -> mx.array:
        """Scores [H_kv, T], float32, higher = more worth keeping."""
        raise NotImplementedError

    def always_kept(self, n_tokens: int, params: MethodParams) -> np.ndarray:
        """Positions ranked above every scored one, highest priority first (kept as far as the budget allows)."""
        return np.zeros(0, np.int64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def effective_window(obs: LayerObservation, params: MethodParams) -> int:
    """The window actually used: `params.window`, or fewer when the prompt is shorter; never more than captured."""
    captured = obs.window_queries.shape[1]
    w = min(params.window, obs.n_tokens)
    if w > captured:
        raise ValueError(
            f"window {params.window} needs {w} captured queries but prefill kept {captured}: "
            f"capture with window >= {params.window}"
        )
    return w


def window_attention(obs: LayerObservation, w: int) -> mx.array:
    """Causal softmax attention [H_q, w, T] of the last `w` prompt queries over all prompt keys (float32)."""
    n_tokens, group = obs.n_tokens, obs.group
    q = obs.window_queries[:, -w:].astype(mx.float32) * obs.scale  # [H_q, w, D]
    k = obs.keys.astype(mx.float32)  # [H_kv, T, D]
    q = q.reshape(obs.n_kv_heads, group, w, -1)
    logits = q @ k.transpose(0, 2, 1)[:, None]  # [H_kv, group, w, T]
    query_pos = mx.arange(n_tokens - w, n_tokens)[:, None]
    logits = mx.where(mx.arange(n_tokens)[None, :] <= query_pos, logits, -mx.inf)
    return mx.softmax(logits, axis=-1, precise=True).reshape(obs.n_q_heads, w, n_tokens)


def group_mean(per_query_head: mx.array, n_kv_heads: int) -> mx.array:
    """[H_q, T] -> [H_kv, T]: mean over each GQA group (query head h reads kv-head h // group)."""
    n_q_heads, n_tokens = per_query_head.shape
    return per_query_head.reshape(n_kv_heads, n_q_heads // n_kv_heads, n_tokens).mean(axis=1)
