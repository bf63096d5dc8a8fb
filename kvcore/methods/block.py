"""block (kvpress's BlockPress, simulating KeyDiff's block prompt processing, Park et al. 2025).

The budget n is filled with the first n positions; then each block of `block_size` later positions joins the
kept ones, the inner method scores that set's keys and values, and each kv-head keeps its top n of them. So the
cache never holds more than n + block_size pairs, as under a memory cap during chunked prefill (simulated here
from the full prefill, as kvpress does). The inner method must score from keys and values alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.declared import param
from kvcore.methods.base import Method, Pick
from kvcore.methods.wrapper import Wrapper, cache_scorer_refusal, subset


@dataclass(frozen=True)
class Block(Wrapper):
    name = "block"
    description = (
        "Blocks of the prompt added one at a time, each time cutting back to the budget by the inner scores"
    )
    paper = (
        "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in Resource-"
        "Constrained Environments (Park et al. 2025; its block-wise compression), arXiv:2504.15364"
    )
    default_inner = "keydiff"
    budget = "uniform"
    chooses = True

    block_size: int = param(
        128, "positions added per step (a prompt shorter than this is one block)", minimum=1
    )

    @classmethod
    def refusal(cls, inner: type[Method]) -> str | None:
        return cache_scorer_refusal(cls.name, inner)

    def choose(self, pick: Pick) -> np.ndarray:
        n_heads, n_tokens = pick.scores.shape
        n = min(pick.n, n_tokens)
        size = min(self.block_size, n_tokens)
        kept = np.broadcast_to(np.arange(n), (n_heads, n))
        for start in range(n, n_tokens, size):
            block = np.arange(start, min(start + size, n_tokens))
            current = np.concatenate([kept, np.broadcast_to(block, (n_heads, block.size))], axis=1)
            scores = np.array(self.inner.scores(subset(pick.obs, current), pick.layer), np.float32)
            top = np.argsort(-scores, axis=1, kind="stable")[:, :n]
            kept = np.take_along_axis(current, top, axis=1)
        return np.sort(kept, axis=1).astype(np.int32)
