"""non_causal_attention (Chari & Van Durme 2025, Compactor; kvpress's NonCausalAttnPress): chunked attention both ways.

The prompt is cut into chunks of `chunk_size` positions; inside each chunk every (post-RoPE) query attends to every
key of the chunk, before and after it (no causal mask, no 1/√d scale, as kvpress). A key's score is the sum over the
chunk's queries of that attention, averaged over the GQA group, times ‖v‖₂, smoothed by a mean over 3 neighbours
(zero-padded at the ends) and z-scored over every head of the layer. The last chunk is zero-padded as kvpress pads
it: padded keys take logit −1e-9 (≈ 0, not −∞) and padded queries attend uniformly, adding to the last chunk.

Reads every prompt query: a CPU prefill keeps them (the lazy h2o capture) until h2o's sums are first computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from kvcore.capture.prefill import BLOCK_ELEMENTS, LayerObservation
from kvcore.methods.base import Method, param
from kvcore.methods.leverage import z_scored

#: kvpress fills the padded keys' logits with this (not −∞), so they still take attention.
PAD_LOGIT = -1e-9


def prompt_queries(obs: LayerObservation, method: str) -> mx.array:
    """Every prompt query [H_q, T, D] (post-RoPE, float32); ValueError naming `method` when they were not kept."""
    chunks = obs.pending_queries or []
    if obs.latent or sum(q.shape[1] for q in chunks) != obs.n_tokens:
        raise ValueError(
            f"{method} needs every prompt query, which a CPU prefill keeps (not a session file, a CUDA prefill, MLA "
            "layers, or a long prompt's after h2o: kvcore.defaults.KEEP_PROMPT_QUERIES_BYTES): prefill again and "
            "run it before h2o"
        )
    return mx.concatenate(chunks, axis=1).astype(mx.float32)


def chunked_column_sums(queries: mx.array, keys: mx.array, chunk_size: int) -> mx.array:
    """[H, S]: per chunk, the softmax rows of queries [H, S, D] over the chunk's keys [H, S, D], summed over rows."""
    n_heads, n_tokens, head_dim = queries.shape
    n_chunks = -(-n_tokens // chunk_size)
    pad = n_chunks * chunk_size - n_tokens
    widths = [(0, 0), (0, pad), (0, 0)]
    q = mx.pad(queries, widths).reshape(n_heads, n_chunks, chunk_size, head_dim)
    k = mx.pad(keys, widths).reshape(n_heads, n_chunks, chunk_size, head_dim)
    valid = mx.arange(n_chunks * chunk_size).reshape(1, n_chunks, 1, chunk_size) < n_tokens
    block = max(1, BLOCK_ELEMENTS // (n_heads * chunk_size * chunk_size))
    sums = []
    for start in range(0, n_chunks, block):
        stop = min(start + block, n_chunks)
        dots = q[:, start:stop] @ k[:, start:stop].transpose(0, 1, 3, 2)  # padded query rows are 0 already
        dots = mx.where(valid[:, start:stop], dots, PAD_LOGIT)
        sums.append(mx.softmax(dots, axis=-1, precise=True).sum(axis=-2))
    return mx.concatenate(sums, axis=1).reshape(n_heads, -1)[:, :n_tokens]


def non_causal_scores(
    queries: mx.array, keys: mx.array, values: mx.array, n_kv_heads: int, chunk_size: int
) -> mx.array:
    """z-scored scores [H_kv, S] from post-RoPE queries [H_q, S, D], keys and values [H_kv, S, D] (float32)."""
    n_q_heads, n_tokens, _ = queries.shape
    group = n_q_heads // n_kv_heads
    sums = chunked_column_sums(queries, mx.repeat(keys, group, axis=0), chunk_size)
    scores = sums.reshape(n_kv_heads, group, n_tokens).mean(axis=1) * mx.sqrt((values * values).sum(axis=-1))
    padded = mx.pad(scores, [(0, 0), (1, 1)])
    smoothed = (padded[:, :-2] + padded[:, 1:-1] + padded[:, 2:]) / 3
    return z_scored(smoothed)


@dataclass(frozen=True)
class NonCausalAttention(Method):
    name = "non_causal_attention"
    description = (
        "Attention each key gets from every query of its chunk, both directions, times ‖v‖; z-scored"
    )
    paper = (
        "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage Scores (Chari & "
        "Van Durme 2025), arXiv:2507.08143"
    )

    chunk_size: int = param(256, "positions per chunk of the non-causal attention", minimum=1)

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        queries = prompt_queries(obs, self.name)
        if obs.values is None:
            raise ValueError(f"{self.name} weighs by the values, which a latent (MLA) layer does not cache")
        keys, values = obs.keys.astype(mx.float32), obs.values.astype(mx.float32)
        return non_causal_scores(queries, keys, values, obs.n_kv_heads, self.chunk_size)
