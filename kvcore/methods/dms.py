"""dms (kvpress's DMSPress, a dense-prefill reading of Łańcucki et al. 2025, Dynamic Memory Sparsification):
a score threshold instead of a ratio.

Each kv-head evicts every position whose inner score is below `threshold`, except the last `sliding_window_size`
positions, which are protected; so heads keep different counts and the run's ratio does not apply. kvpress
applies it at prefill (decoding=False); the threshold's scale is the inner method's (snapkv: attention shares).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcore.declared import param
from kvcore.methods.base import Pick
from kvcore.methods.wrapper import Wrapper


@dataclass(frozen=True)
class DMS(Wrapper):
    name = "dms"
    description = (
        "Positions scored below a threshold by the inner method evicted, the recent window protected"
    )
    paper = (
        "Inference-Time Hyper-Scaling with KV Cache Compression (DMS, Łańcucki et al. 2025), arXiv:2506.05345"
    )
    default_inner = "snapkv"
    budget = "uniform"
    chooses = True
    spreads_over_heads = True  # each kv-head keeps its own count

    threshold: float = param(0.01, "positions scoring below this (the inner method's scale) are evicted")
    sliding_window_size: int = param(128, "the last positions, never evicted", minimum=0)

    def choose(self, pick: Pick) -> list[np.ndarray]:
        n_heads, n_tokens = pick.scores.shape
        start = max(n_tokens - self.sliding_window_size, 0)
        older = pick.scores[:, :start]
        low, high = pick.score_range
        if not low <= self.threshold <= high:
            raise ValueError(
                f"{self.label}: threshold {self.threshold:g} is outside every layer's scores ({low:.4g} to "
                f"{high:.4g}), so it evicts all or nothing: pick one in that range (--param threshold=X)"
            )
        kept = []
        for h in range(n_heads):
            keep = np.concatenate([np.flatnonzero(older[h] >= self.threshold), np.arange(start, n_tokens)])
            if keep.size == 0:
                raise ValueError(
                    f"{self.label}: kv-head {h} of layer {pick.layer} keeps nothing: lower the threshold or "
                    "protect a window (--param sliding_window_size=N)"
                )
            kept.append(keep.astype(np.int32))
        return kept
