"""chunk (kvpress's ChunkPress, after FINCH, Corallo & Papotti 2024): each chunk of the prompt compressed alone.

The prompt is cut into chunks of `chunk_length`; the inner method scores each chunk's keys and values as if they
were the whole cache, and each kv-head keeps max(1, int(len · r)) of every chunk, so no stretch of the prompt is
emptied by a scorer that favours another. The inner method must score from keys and values alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.declared import param
from kvcore.methods.base import Method, Pick
from kvcore.methods.chunkkv import check_chunk
from kvcore.methods.wrapper import Wrapper, cache_scorer_refusal, subset


@dataclass(frozen=True)
class Chunk(Wrapper):
    name = "chunk"
    description = "Each chunk of the prompt scored and compressed on its own by the inner method"
    paper = (
        "FINCH: Prompt-guided Key-Value Cache Compression for Large Language Models (Corallo & Papotti, TACL "
        "2024; its chunked compression), doi:10.1162/tacl_a_00716"
    )
    default_inner = "knorm"
    budget = "uniform"
    chooses = True

    chunk_length: int = param(
        1024, "chunk length: each chunk keeps the ratio of its own positions", minimum=1
    )

    @classmethod
    def refusal(cls, inner: type[Method]) -> str | None:
        return cache_scorer_refusal(cls.name, inner)

    def choose(self, pick: Pick) -> np.ndarray:
        n_tokens = pick.scores.shape[1]
        check_chunk(self.label, self.chunk_length, n_tokens)
        kept = []
        for start in range(0, n_tokens, self.chunk_length):
            positions = np.arange(start, min(start + self.chunk_length, n_tokens))
            scores = np.array(self.inner.scores(subset(pick.obs, positions), pick.layer), np.float32)
            n = max(1, int(len(positions) * (1 - (1 - pick.ratio))))
            kept.append(start + np.argsort(-scores, axis=1, kind="stable")[:, :n])
        return np.sort(np.concatenate(kept, axis=1), axis=1).astype(np.int32)
