"""Decoding-time eviction (issue 40): compress the cache while the model writes, not only after the prefill.

A `DecodingPolicy` generates greedily from a copy of a compressed state and, every `interval` tokens appended to
the cache, evicts every compressible layer down to `budget` rows per kv-head with `select_positions` — the rows
are really dropped (no masking), so a layer never holds more than budget + interval rows. A cache that starts
above the budget (the prefill kept more) is evicted before the first token.

Policies:
- `streaming_llm` (Xiao et al. 2023), the rolling window: the first `n_sink` positions (attention sinks) and the
  most recent budget − n_sink.
- `knorm` (Devoto et al. 2024): the `budget` cached keys of lowest L2 norm per kv-head, scored on the keys the
  cache holds (dequantized when packed), prompt and generated alike, as kvpress's DecodingPress over KnormPress.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache import sparse as caches
from kvcore.cache.residual import ResidualKVCache
from kvcore.capture.prefill import Cancelled
from kvcore.defaults import DEFAULT_DECODE_INTERVAL, DEFAULT_N_SINK, DEFAULT_QUANT

#: The decoding policies, by name.
DECODE_METHODS = ("streaming_llm", "knorm")

__all__ = [
    "DECODE_METHODS",
    "Compression",
    "DecodeCancelled",
    "DecodeStep",
    "DecodingPolicy",
    "DecodingRun",
    "decode_with_policy",
]


@dataclass(frozen=True)
class DecodingPolicy:
    """Which method evicts, down to how many rows per kv-head (`budget`), every how many tokens (`interval`).

    `n_sink` is streaming_llm's count of attention sinks (other methods ignore it). Bad values raise ValueError
    with one line, so the CLI refuses them before the model loads.
    """

    method: str
    budget: int
    interval: int = DEFAULT_DECODE_INTERVAL
    n_sink: int = DEFAULT_N_SINK

    def __post_init__(self) -> None:
        if self.method not in DECODE_METHODS:
            raise ValueError(
                f"decoding method {self.method!r} is not one of {', '.join(DECODE_METHODS)}: pick one of them"
            )
        if self.interval < 1:
            raise ValueError(f"decoding interval must be at least 1 token, got {self.interval}")
        if self.n_sink < 0:
            raise ValueError(f"n_sink must be at least 0, got {self.n_sink}")
        least = self.n_sink + 1 if self.method == "streaming_llm" else 1
        if self.budget < least:
            what = f"n_sink + 1 = {least} (the sinks and at least one recent token)" if least > 1 else "1"
            raise ValueError(
                f"decoding budget {self.budget} is too small for {self.method}: give at least {what}"
            )

    def keep_rows(self, layer: Any, positions: list[np.ndarray]) -> list[np.ndarray] | None:
        """Per kv-head, the sorted content rows of `layer` to keep; None when no head holds more than the budget."""
        if max(len(p) for p in positions) <= self.budget:
            return None
        if self.method == "streaming_llm":
            return [self._rolling(p) for p in positions]
        return self._lowest_norms(layer, positions)

    def _rolling(self, pos: np.ndarray) -> np.ndarray:
        rows = np.arange(len(pos))
        if len(pos) <= self.budget:
            return rows
        recent = rows[len(pos) - (self.budget - self.n_sink) :]
        return np.union1d(rows[pos < self.n_sink], recent)

    def _lowest_norms(self, layer: Any, positions: list[np.ndarray]) -> list[np.ndarray]:
        norms = _key_norms(layer, positions)
        out = []
        for norm in norms:
            if len(norm) <= self.budget:
                out.append(np.arange(len(norm)))
            else:  # stable: among equal norms the earlier row wins
                out.append(np.sort(np.argsort(norm, kind="stable")[: self.budget]))
        return out


@dataclass(frozen=True)
class DecodeStep:
    """The cache right after one token was appended (before any eviction at that step: its peak)."""

    step: int  # tokens appended so far, 1-based
    rows: list[int]  # stored rows per kv-head of each layer (padding included; 0 for a layer storing no rows)
    bytes: int  # kvcore.cache.sparse.cache_tensor_bytes of the whole cache
    compressed: bool  # whether the policy evicted after this token


@dataclass(frozen=True)
class Compression:
    """One eviction: the logical positions each (layer, kv-head) kept, and the cache after it."""

    step: int  # tokens appended before it (0: the state was above the budget before decoding)
    kept: list[list[list[int]] | None]  # [layer][kv_head] kept positions; None for a layer stored whole
    rows: list[int]
    bytes: int


@dataclass
class DecodingRun:
    """A greedy continuation under a decoding policy, with the cache's size at every step."""

    policy: DecodingPolicy
    tokens: list[int]
    steps: list[DecodeStep] = field(default_factory=list)
    compressions: list[Compression] = field(default_factory=list)
    start_rows: list[int] = field(default_factory=list)
    start_bytes: int = 0

    @property
    def max_cache_tokens(self) -> int:
        """The most rows any layer stored per kv-head while decoding (the state's own rows are `start_rows`)."""
        held = [r for s in self.steps for r in s.rows] or [r for c in self.compressions for r in c.rows]
        return max(held or self.start_rows, default=0)

    def bytes_summary(self) -> dict[str, int]:
        """min / max / last bytes over the steps (the evicted or the start state when nothing was appended)."""
        values = (
            [s.bytes for s in self.steps] or [c.bytes for c in self.compressions[-1:]] or [self.start_bytes]
        )
        return {"min": min(values), "max": max(values), "last": values[-1]}


class DecodeCancelled(Cancelled):
    """A decode cancelled part way, carrying what it generated until then (`run`): the GUI keeps it (Esc)."""

    def __init__(self, message: str, run: DecodingRun) -> None:
        super().__init__(message)
        self.run = run


def decode_with_policy(
    session: Any,
    state: Any,
    policy: DecodingPolicy,
    n: int,
    should_cancel: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> DecodingRun:
    """n greedy tokens from a copy of `state`'s cache (the state is not changed), evicting as `policy` says.

    Starts as `Session.continuation` does: under "paper" the first token is the dense prefill's, under "mlx-lm"
    the last prompt token is fed first. Uses the session's public members only; call it on the session's thread.
    """
    if n < 1:
        raise ValueError(f"tokens to generate must be at least 1, got {n}")
    if not session.dense_tokens:
        raise ValueError("no prefill: prefill a prompt before decoding")
    if any(isinstance(c, ResidualKVCache) for c in state.cache):
        raise ValueError(
            "decoding policies evict from plain sparse caches: drop fp_recent (the float residual) to use one"
        )
    cache = caches.copy_cache(state.cache)
    run = DecodingRun(policy, [], start_rows=_rows(cache), start_bytes=caches.cache_tensor_bytes(cache))
    cache = _evict(cache, policy, run, 0)
    if state.config.schedule == "paper":
        feed, run.tokens = session.dense_tokens[0], [session.dense_tokens[0]]
    else:
        feed = session.prompt_ids[-1]
    if should_cancel is not None and should_cancel():
        raise DecodeCancelled(f"generation cancelled after {len(run.tokens)} of {n} tokens", run)
    # Pipelined as Session._greedy: step i + 1 is queued before token i is read back. An eviction waits for the
    # queued step (its gathers read the rows that step wrote), then the next step runs on the evicted cache.
    pending = _step(session, cache, mx.array([[feed]])) if len(run.tokens) < n else None
    appended = 0
    while pending is not None:
        appended += 1
        rows, size = _rows(cache), caches.cache_tensor_bytes(cache)
        evict = appended % policy.interval == 0
        if evict:
            cache = _evict(cache, policy, run, appended)
        run.steps.append(DecodeStep(appended, rows, size, evict))
        following = _step(session, cache, pending) if len(run.tokens) + 1 < n else None
        run.tokens.append(int(pending.item()))
        if on_progress is not None:
            on_progress(len(run.tokens), n)
        if following is not None and should_cancel is not None and should_cancel():
            raise DecodeCancelled(f"generation cancelled after {len(run.tokens)} of {n} tokens", run)
        pending = following
    return run


def _step(session: Any, cache: list[Any], y: mx.array) -> mx.array:
    """Feed token(s) `y` [1, 1] through `cache` (appending a row) and queue the greedy next token [1, 1]."""
    logits = session.model(y, cache=cache)
    session.forward_calls += 1
    out = mx.argmax(logits[:, -1], axis=-1, keepdims=True)
    mx.async_eval(out)
    return out


def _evict(cache: list[Any], policy: DecodingPolicy, run: DecodingRun, step: int) -> list[Any]:
    """Drop every compressible layer to the budget with select_positions; records a Compression when it did."""
    indices: list[Any] = []
    positions_before: list[list[np.ndarray] | None] = []
    for layer in cache:
        positions = _positions(layer)
        positions_before.append(positions)
        indices.append(None if positions is None else policy.keep_rows(layer, positions))
    if all(i is None for i in indices):
        return cache
    cache = caches.select_positions(cache, indices)
    kept = [
        None if p is None else [q.tolist() for q in _positions(c)]
        for c, p in zip(cache, positions_before, strict=True)
    ]
    run.compressions.append(Compression(step, kept, _rows(cache), caches.cache_tensor_bytes(cache)))
    return cache


def _positions(layer: Any) -> list[np.ndarray] | None:
    """Per kv-head logical positions of the stored rows, in row order; None for a layer stored whole."""
    if caches.incompressible_reason(layer) is not None or getattr(layer, "keys", None) is None:
        return None
    if hasattr(layer, "retained_positions"):
        return [np.asarray(p) for p in layer.retained_positions]
    keys = layer.keys[0] if isinstance(layer.keys, tuple | list) else layer.keys
    n_heads = int(keys.shape[1])
    return [np.arange(layer.offset, dtype=np.int32)] * n_heads


def _rows(cache: list[Any]) -> list[int]:
    """Rows each layer stores per kv-head: a sparse layer's padded width, a dense one's offset, a window's size."""
    out = []
    for layer in cache:
        if getattr(layer, "keys", None) is None:
            out.append(0)
        elif hasattr(layer, "n_kept"):
            out.append(int(layer.n_kept))
        else:
            window = caches.sliding_window(layer)
            out.append(int(layer.offset) if window is None else min(int(layer.offset), window))
    return out


def _key_norms(layer: Any, positions: list[np.ndarray]) -> list[np.ndarray]:
    """Per kv-head L2 norm of each stored key, in content-row order (float32, dequantized when packed)."""
    keys, _ = layer.keys_and_values() if hasattr(layer, "keys_and_values") else (layer.keys, None)
    if hasattr(layer, "bits"):
        keys = caches.dequantized(keys, layer.group_size, layer.bits, getattr(layer, "quant", DEFAULT_QUANT))
    keys = keys[0].astype(mx.float32)
    norms = np.array(mx.sqrt((keys * keys).sum(axis=-1)))  # [H_kv, buffer rows]
    if not getattr(layer, "is_ragged", False):
        return [norms[h, : len(p)] for h, p in enumerate(positions)]
    counts, n_prefix = layer.kept_counts - layer.n_appended, layer.n_prefix
    return [np.concatenate([norms[h, :c], norms[h, n_prefix:]]) for h, c in enumerate(counts.tolist())]
