"""Per-token KL and top-1 agreement of a decoding policy against the dense cache, on the policy's own tokens.

A decoding run writes thousands of tokens; the dense continuation of the prefill is usually far shorter. So the
dense side runs in lockstep: every token the policy's cache is fed also goes through a copy of the dense cache,
and both next-token distributions are compared on the same history (kvcore.measure.metrics.compare, targets the
dense top-1). Until the first disagreement that history is the dense greedy continuation itself, so the first
index whose top-1 differs is the run's first divergence from dense. Logits are reduced in chunks, so a long run
over a large vocabulary never holds more than CHUNK rows of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache import sparse as caches
from kvcore.engine.decoding import DecodeCancelled, DecodingPolicy, DecodingRun, decode_with_policy
from kvcore.engine.session import CompressionConfig
from kvcore.measure import metrics

#: Steps of logits held before they are reduced to per-token metrics.
CHUNK = 64

__all__ = ["DecodeComparison", "decode_against_dense"]


@dataclass(frozen=True)
class DecodeComparison:
    """A decoding run and, per generated token, its comparison with the dense cache on the same history."""

    run: DecodingRun
    steps: metrics.StepMetrics  # one row per token of run.tokens
    first_compared: int  # tokens before it came from the dense prefill ("paper"): KL 0, nothing compared
    cancelled: bool = False  # cut short by a cancel: run holds what was generated until then

    @property
    def first_divergence(self) -> int | None:
        """The first token whose top-1 differs from the dense cache's on the same history (None: none does)."""
        differ = np.flatnonzero(~np.asarray(self.steps.agreement[self.first_compared :], dtype=bool))
        return int(differ[0]) + self.first_compared if differ.size else None


class _Lockstep:
    """The session as decode_with_policy sees it, but whose model also feeds each token to a dense cache and
    keeps both last-position logits; every other attribute is the session's."""

    def __init__(self, session: Any, dense_cache: list[Any]) -> None:
        self._session, self._dense = session, dense_cache
        self.forward_calls = 0
        self.pending: list[tuple[mx.array, mx.array]] = []
        self.reduced: list[metrics.StepMetrics] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def model(self, y: mx.array, cache: list[Any]) -> mx.array:
        logits = self._session.model(y, cache=cache)
        dense = self._session.model(y, cache=self._dense)
        self.forward_calls += 1  # the dense call (decode_with_policy counts its own)
        self.pending.append((logits[0, -1].astype(mx.float32), dense[0, -1].astype(mx.float32)))
        if len(self.pending) >= CHUNK:
            self.flush()
        return logits

    def flush(self) -> None:
        """Reduce the held logits to StepMetrics (targets: the dense top-1)."""
        if not self.pending:
            return
        comp = np.array(mx.stack([c for c, _ in self.pending]))
        dense = np.array(mx.stack([d for _, d in self.pending]))
        self.pending = []
        ref = metrics.reference(dense)
        self.reduced.append(metrics.compare(ref, comp, dense.argmax(axis=-1), 0)[1])


def decode_against_dense(
    session: Any,
    state: Any,
    policy: DecodingPolicy,
    n: int,
    should_cancel: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> DecodeComparison:
    """decode_with_policy(session, state, policy, n) with the dense cache beside it (see the module docstring).

    A cancel returns what was generated until then (`cancelled` True) instead of raising, unless nothing was."""
    dense = session.compress(CompressionConfig("full", 1.0, schedule=state.config.schedule))
    lockstep = _Lockstep(session, caches.copy_cache(dense.cache))
    cancelled = False
    try:
        run = decode_with_policy(lockstep, state, policy, n, should_cancel, on_progress)
    except DecodeCancelled as exc:
        if not exc.run.steps:
            raise
        run, cancelled = exc.run, True
    session.forward_calls += lockstep.forward_calls
    lockstep.flush()
    first = len(run.tokens) - len(run.steps)  # "paper": the first token is the dense prefill's
    return DecodeComparison(run, _joined(lockstep.reduced, first, len(run.tokens)), first, cancelled)


def _joined(parts: list[metrics.StepMetrics], first: int, n: int) -> metrics.StepMetrics:
    """The chunks as one StepMetrics of n rows: `first` dense rows (KL 0, agreeing, no top-k) before the
    compared ones, and the rows of a step queued after the last token read back dropped."""
    k = metrics.TOP_K
    fields = {
        "kl": np.zeros(0),
        "agreement": np.zeros(0, bool),
        "dense_top_ids": np.zeros((0, k), np.int64),
        "dense_top_probs": np.zeros((0, k)),
        "compressed_top_ids": np.zeros((0, k), np.int64),
        "compressed_top_probs": np.zeros((0, k)),
    }
    out = {}
    for name, empty in fields.items():
        lead = (
            np.ones(first, bool) if name == "agreement" else np.zeros((first, *empty.shape[1:]), empty.dtype)
        )
        rows = [np.asarray(getattr(p, name)) for p in parts]
        out[name] = np.concatenate([lead, *rows, empty[:0]])[:n]
    return metrics.StepMetrics(**out)
