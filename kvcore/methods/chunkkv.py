"""chunkkv (Liu et al. 2025, ChunkKV): keep whole chunks of the prompt, ranked by their inner-method scores.

Every chunk of `chunk_length` positions (the last one shorter) scores the mean over its positions of the inner
scores summed over kv-heads; the top max(1, int(n_chunks · r)) chunks are kept whole, by every kv-head. Chunks keep
the phrases a scorer would break apart. kvpress's ChunkKVPress, default 20.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.declared import param
from kvcore.methods.base import Pick
from kvcore.methods.wrapper import Wrapper, padded_scores


def check_chunk(name: str, chunk_length: int, n_tokens: int) -> None:
    """A chunk longer than the prompt leaves the wrapper nothing to do: one line naming the fix."""
    if chunk_length > n_tokens:
        raise ValueError(
            f"{name}: chunk_length {chunk_length} is longer than the prompt ({n_tokens} tokens): "
            f"set chunk_length <= {n_tokens} (--param chunk_length=N) or use the inner method alone"
        )


def chunk_means(pick: Pick, always: np.ndarray, chunk_length: int) -> np.ndarray:
    """[H_kv, T]: each position's chunk score (the mean over its chunk of the head-summed scores), the same in
    every kv-head: what the chunk wrappers rank by, for the heatmap."""
    n_heads, n_tokens = pick.scores.shape
    per_position = padded_scores(pick.scores, always).astype(np.float64).sum(axis=0)
    means = np.concatenate(
        [
            np.full(len(per_position[s : s + chunk_length]), per_position[s : s + chunk_length].mean())
            for s in range(0, n_tokens, chunk_length)
        ]
    )
    return np.broadcast_to(means.astype(np.float32), (n_heads, n_tokens)).copy()


@dataclass(frozen=True)
class ChunkKV(Wrapper):
    name = "chunkkv"
    description = "Whole chunks kept, ranked by the mean of the inner method's scores over each chunk"
    paper = (
        "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM Inference (Liu et "
        "al. 2025), arXiv:2502.00299"
    )
    default_inner = "snapkv"
    shared_across_heads = True
    chooses = True

    chunk_length: int = param(
        20, "chunk length: the prompt is kept or dropped in chunks of this size", minimum=1
    )

    def final_scores(self, pick: Pick) -> np.ndarray:
        return chunk_means(pick, self.inner.always_kept(pick.scores.shape[1]), self.chunk_length)

    def choose(self, pick: Pick) -> np.ndarray:
        n_tokens = pick.scores.shape[1]
        check_chunk(self.label, self.chunk_length, n_tokens)
        always = self.inner.always_kept(n_tokens)
        per_position = padded_scores(pick.scores, always).astype(np.float64).sum(axis=0)
        starts = np.arange(0, n_tokens, self.chunk_length)
        chunk_scores = np.array([per_position[s : s + self.chunk_length].mean() for s in starts])
        n_chunks = max(1, int(len(starts) * (1 - (1 - pick.ratio))))
        top = np.argsort(-chunk_scores, kind="stable")[:n_chunks]
        kept = [np.arange(s, min(s + self.chunk_length, n_tokens)) for s in starts[top]]
        return np.sort(np.concatenate(kept)).astype(np.int32)
