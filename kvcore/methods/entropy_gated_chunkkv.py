"""entropy_gated_chunkkv (kvpress's EntropyGatedChunkKVPress, over ChunkKV, Liu et al. 2025): chunks, gated by the
entropy of the scores inside each.

ChunkKV spends a whole chunk on a chunk whose importance is one token. Here each chunk of `chunk_length` positions
(the last one shorter) has a mean score (inner scores summed over kv-heads) and a normalised entropy of its scores
(rebased to be non-negative when a score is negative; 0 for a one-position tail). Chunks are visited by descending
mean: a chunk at or above the median mean whose entropy is below the median entropy ("important but spiky") keeps
only its top `low_entropy_chunk_length` positions, any other is kept whole, until the budget
max(1, int(T · r)) runs out (the last chunk visited keeps its top positions); budget left over goes to the
highest-scoring positions not yet kept. Medians are the lower middle value, as torch's. Every kv-head keeps the
same positions. kvpress's defaults: chunks of 10, spiky chunks keep 4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvcore.declared import param
from kvcore.methods import budgets
from kvcore.methods.base import Pick
from kvcore.methods.chunkkv import check_chunk, chunk_means
from kvcore.methods.wrapper import Wrapper, padded_scores

EPSILON = 1e-8  # kvpress's: keeps the entropy of an all-zero chunk finite


def lower_median(values: np.ndarray) -> float:
    """The lower of the two middle values for an even count (torch.median's), not their mean."""
    return float(np.sort(values)[(values.size - 1) // 2])


def normalised_entropy(scores: np.ndarray) -> float:
    """Entropy of one chunk's scores as a distribution, over log of its length, clipped to [0, 1]."""
    if scores.size == 1:
        return 0.0
    rebased = scores - min(float(scores.min()), 0.0)
    p = rebased / (rebased.sum() + EPSILON)
    h = -(p * np.log(p + EPSILON)).sum()
    return float(np.clip(h / math.log(scores.size), 0.0, 1.0))


def top_positions(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest scores (ties: lower index first)."""
    return np.argsort(-scores, kind="stable")[:k]


@dataclass(frozen=True)
class EntropyGatedChunkKV(Wrapper):
    name = "entropy_gated_chunkkv"
    description = "ChunkKV whose important but spiky chunks (low score entropy) keep only their top positions"
    paper = (
        "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM Inference (Liu et "
        "al. 2025; kvpress's entropy gate), arXiv:2502.00299"
    )
    default_inner = "snapkv"
    shared_across_heads = True
    chooses = True

    chunk_length: int = param(
        10, "chunk length: the prompt is kept or dropped in chunks of this size", minimum=2
    )
    low_entropy_chunk_length: int = param(
        4, "positions kept from an important chunk whose scores are spiky (low entropy)", minimum=1
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.low_entropy_chunk_length >= self.chunk_length:
            raise ValueError(
                f"{self.label}: low_entropy_chunk_length {self.low_entropy_chunk_length} must be below "
                f"chunk_length {self.chunk_length}: lower it (--param low_entropy_chunk_length=N)"
            )

    def final_scores(self, pick: Pick) -> np.ndarray:
        return chunk_means(pick, self.inner.always_kept(pick.scores.shape[1]), self.chunk_length)

    def choose(self, pick: Pick) -> np.ndarray:
        n_tokens = pick.scores.shape[1]
        check_chunk(self.label, self.chunk_length, n_tokens)
        always = self.inner.always_kept(n_tokens)
        per_position = padded_scores(pick.scores, always).astype(np.float64).sum(axis=0)
        starts = np.arange(0, n_tokens, self.chunk_length)
        chunks = [per_position[s : s + self.chunk_length] for s in starts]
        means = np.array([c.mean() for c in chunks])
        entropy = np.array([normalised_entropy(c) for c in chunks])
        spiky = (means >= lower_median(means)) & (entropy < lower_median(entropy))
        budget = budgets.n_kept(n_tokens, pick.ratio)
        keep = np.zeros(n_tokens, bool)
        for c in np.argsort(-means, kind="stable"):
            if budget <= 0:
                break
            n = min(len(chunks[c]), budget)
            if spiky[c]:
                n = min(n, self.low_entropy_chunk_length)
            keep[starts[c] + top_positions(chunks[c], n)] = True
            budget -= n
        if budget > 0:
            leftover = np.flatnonzero(~keep)
            keep[leftover[top_positions(per_position[leftover], budget)]] = True
        return np.flatnonzero(keep).astype(np.int32)
