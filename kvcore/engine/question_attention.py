"""Where a question looks in its context: the dense model's attention from the question's tokens over the context.

The context followed by the question is prefilled with capture, the question's tokens being the observation
window; each (layer, kv-head) gets the attention of those queries over the context positions (mean over the
question's tokens and the kv-head's GQA group). It is the dense model's attention, the same under either mode,
and one prefill of context + question, so the app computes it for one chosen question on request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import prefill_with_capture
from kvcore.defaults import CAPTURE_WINDOW, QUESTION_ATTENTION_TOP
from kvcore.methods.base import group_mean, window_attention


def question_attention(model: Any, context_ids: Sequence[int], question_ids: Sequence[int]) -> np.ndarray:
    """[L, H_kv, T_context] attention of the question's tokens over the context; NaN rows for layers with no
    observation (sliding window, SSM). ValueError when the question is empty or longer than the capture window."""
    if not question_ids:
        raise ValueError("the question has no tokens: type some text")
    if len(question_ids) > CAPTURE_WINDOW:
        raise ValueError(
            f"the question has {len(question_ids)} tokens; at most {CAPTURE_WINDOW} can be observed: shorten it"
        )
    n_context, w = len(context_ids), len(question_ids)
    capture = prefill_with_capture(
        model, [*context_ids, *question_ids], window=w, h2o=False, query_stats=False
    )
    rows = []
    for obs in capture.observations:
        if obs is None:
            rows.append(None)
            continue
        attn = window_attention(obs, w).mean(axis=1)  # [H_q, T]: mean over the question's queries
        rows.append(group_mean(attn, obs.n_kv_heads)[:, :n_context])
    mx.eval([r for r in rows if r is not None])
    heads = next((r.shape[0] for r in rows if r is not None), 0)
    return np.stack(
        [
            np.full((heads, n_context), np.nan, np.float32) if r is None else np.array(r, np.float32)
            for r in rows
        ]
    )


def top_positions(attention: np.ndarray, k: int = QUESTION_ATTENTION_TOP) -> np.ndarray:
    """[L, H_kv, T] bool: each row's k most attended positions (ties to the earlier position; NaN rows none)."""
    flat = attention.reshape(-1, attention.shape[-1])
    marked = np.zeros(flat.shape, dtype=bool)
    k = min(k, flat.shape[1])
    for r, row in enumerate(flat):
        if k and not np.isnan(row).all():
            order = np.lexsort((np.arange(row.size), -np.nan_to_num(row, nan=-np.inf)))
            marked[r, order[:k]] = True
    return marked.reshape(attention.shape)
