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
- the re-scoring policies of `kvcore.engine.decode_scoring`: snapkv, tova, keydiff and adakv over the cache's rows
  and the queries of the latest tokens (kvpress's DecodingPress), and `h2o_online` (H2O's accumulated attention
  with its recent window).
- `cam` (Zhang et al. 2024, kvpress's CAMPress over streaming_llm): the rolling window, each evicted value merged
  into the kept rows after it (`kvcore.engine.cam`); the merges are recorded on each Compression.
- `dms` (kvpress's DMSPress with decoding=True, over knorm's scores: Łańcucki et al. 2025 without the trained
  evictor): the newest `budget` rows are a sliding window; an older row is evicted once its score −‖k‖ is below
  `threshold`. The cache then has no fixed size: it keeps every older row that scores at or above the threshold.

The target is `budget` rows per kv-head, or with `ratio` (kvpress's CompressionRatioDecodingPress, whose
target_compression_ratio is 1 − ratio) kvpress's int(n_seen · ratio), at least 1, of the n_seen positions written
so far; either way a layer holds at most target + interval rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache import sparse as caches
from kvcore.cache.residual import ResidualKVCache
from kvcore.capture.prefill import Cancelled
from kvcore.defaults import CAM_MERGE_BUDGET, DEFAULT_DECODE_INTERVAL, DEFAULT_N_SINK, DEFAULT_QUANT
from kvcore.engine.cam import CacheMerger, CamMerge
from kvcore.engine.decode_scoring import H2O_ONLINE, RESCORING_METHODS, QueryBuffer, Rescorer
from kvcore.methods.budgets import n_kept
from kvcore.model import attention

#: The decoding policies, by name.
DECODE_METHODS = ("streaming_llm", "knorm", *RESCORING_METHODS, H2O_ONLINE, "dms", "cam")
#: Policies whose eviction is the rolling window (sinks + most recent).
_ROLLING = ("streaming_llm", "cam")

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
    """Which method evicts, down to how many rows per kv-head (`budget`, or `ratio` of the positions seen), every
    how many tokens (`interval`).

    `n_sink` is streaming_llm's count of attention sinks (other methods ignore it). Bad values raise ValueError
    with one line, so the CLI refuses them before the model loads.
    """

    method: str
    budget: int | None = None
    interval: int = DEFAULT_DECODE_INTERVAL
    n_sink: int = DEFAULT_N_SINK
    ratio: float | None = None
    #: The observation window of snapkv and the methods built on it (None: the method's own, 64), capped at the
    #: queries recorded since the last check.
    window: int | None = None
    #: Evict a state above the target before the first token (the bound budget + interval from the start);
    #: False checks only every `interval` tokens, as kvpress's DecodingPress (parity).
    evict_before_decoding: bool = True
    #: Parity with kvpress's DecodingPress as it runs on a CPU (snapkv, tova, knorm): its buffered window queries
    #: are all rotated at the newest position (kvpress re-projects hidden states with the current step's RoPE),
    #: and rows are stored and ranked in the order its topk gather leaves them (`kvcore.engine.torch_topk`: equal
    #: scores included), which snapkv's pooling runs along. False: each query at its own position, rows by
    #: position, ties to the earlier row.
    kvpress_form: bool = False
    #: dms: rows older than the sliding window (`budget`) scoring below this are evicted.
    threshold: float | None = None
    #: cam: the kept rows after an evicted one that its value is merged into.
    merge_budget: int = CAM_MERGE_BUDGET

    def __post_init__(self) -> None:
        if self.method not in DECODE_METHODS:
            raise ValueError(
                f"decoding method {self.method!r} is not one of {', '.join(DECODE_METHODS)}: pick one of them"
            )
        if self.interval < 1:
            raise ValueError(f"decoding interval must be at least 1 token, got {self.interval}")
        if self.n_sink < 0:
            raise ValueError(f"n_sink must be at least 0, got {self.n_sink}")
        if (self.budget is None) == (self.ratio is None):
            raise ValueError(
                "give a decoding budget (rows per kv-head) or a ratio of the positions seen, not both"
            )
        if (self.method == "dms") != (self.threshold is not None):
            raise ValueError("a score threshold goes with dms (and dms needs one): give both or neither")
        if self.method == "dms" and self.budget is None:
            raise ValueError(
                "dms's budget is its sliding window (rows always kept): give a budget, not a ratio"
            )
        if self.merge_budget < 1:
            raise ValueError(f"cam's merge budget must be at least 1 row, got {self.merge_budget}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"decoding window must be at least 1 query, got {self.window}")
        if self.ratio is not None and not 0.0 < self.ratio < 1.0:
            raise ValueError(
                f"decoding ratio must be in (0, 1) (the share of positions kept), got {self.ratio}"
            )
        if self.budget is not None and self.budget < self.least:
            least = self.least
            what = f"n_sink + 1 = {least} (the sinks and at least one recent token)" if least > 1 else "1"
            raise ValueError(
                f"decoding budget {self.budget} is too small for {self.method}: give at least {what}"
            )

    @property
    def least(self) -> int:
        """The smallest target the method can keep to."""
        return self.n_sink + 1 if self.method in _ROLLING else 1

    @property
    def rescores(self) -> bool:
        """Whether a `kvcore.engine.decode_scoring.Rescorer` evicts (rather than keep_rows)."""
        return (
            self.method in RESCORING_METHODS
            or self.method == H2O_ONLINE
            or (self.kvpress_form and self.method == "knorm")  # kvpress's row order decides its ties
        )

    def target(self, n_seen: int) -> int:
        """Rows per kv-head after an eviction, with n_seen positions written so far."""
        if self.budget is not None:
            return self.budget
        return max(self.least, n_kept(n_seen, self.ratio))

    def label(self) -> str:
        """One line: method, target and interval (progress bars, reports)."""
        size = f"budget={self.budget}" if self.budget is not None else f"ratio={self.ratio:g}"
        size += f" threshold={self.threshold:g}" if self.threshold is not None else ""
        return f"{self.method} {size} every {self.interval}"

    def keep_rows(
        self, layer: Any, positions: list[np.ndarray], target: int | None = None
    ) -> list[np.ndarray] | None:
        """Per kv-head, the sorted content rows of `layer` to keep; None when no head holds more than the target
        (streaming_llm and knorm; the re-scoring policies go through a Rescorer)."""
        target = self.budget if target is None else target
        assert target is not None
        if max(len(p) for p in positions) <= target:
            return None
        if self.method in _ROLLING:
            return [self._rolling(p, target) for p in positions]
        if self.method == "dms":
            return self._above_threshold(layer, positions, target)
        return self._lowest_norms(layer, positions, target)

    def _above_threshold(
        self, layer: Any, positions: list[np.ndarray], window: int
    ) -> list[np.ndarray] | None:
        """dms: the last `window` rows, and the older ones whose score −‖k‖ is at or above the threshold. A key's
        score never changes, so judging a row again at a later check gives the same answer (kvpress judges each
        once, as it leaves the window: the same rows, at most `interval` tokens later here)."""
        out = []
        for norm in _key_norms(layer, positions):
            rows = np.arange(len(norm))
            older = rows[: max(0, len(norm) - window)]
            out.append(np.concatenate([older[-norm[older] >= self.threshold], rows[len(older) :]]))
        return None if all(len(k) == len(p) for k, p in zip(out, positions, strict=True)) else out

    def _rolling(self, pos: np.ndarray, target: int) -> np.ndarray:
        rows = np.arange(len(pos))
        if len(pos) <= target:
            return rows
        recent = rows[len(pos) - (target - self.n_sink) :]
        return np.union1d(rows[pos < self.n_sink], recent)

    def _lowest_norms(self, layer: Any, positions: list[np.ndarray], target: int) -> list[np.ndarray]:
        norms = _key_norms(layer, positions)
        out = []
        for norm in norms:
            if len(norm) <= target:
                out.append(np.arange(len(norm)))
            else:  # stable: among equal norms the earlier row wins
                out.append(np.sort(np.argsort(norm, kind="stable")[:target]))
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
    #: [layer][kv_head] kept positions (sorted int32 arrays: an 8k-token run keeps hundreds of these, as Python
    #: lists they would weigh ~10x more); None for a layer stored whole
    kept: list[list[np.ndarray] | None]
    rows: list[int]
    bytes: int
    #: With decode_with_policy(keep_scores=True) and a re-scoring policy: the positions each (layer, kv-head) held
    #: before the eviction and the policy's score of each (None for a layer it left alone).
    held: list[list[np.ndarray] | None] | None = None
    scores: list[list[np.ndarray] | None] | None = None
    #: cam: [layer][kv_head] the values merged at this eviction (None for a layer it left alone).
    merges: list[list[CamMerge] | None] | None = None
    #: With keep_scores and the kvpress form: [layer][kv_head] the kept positions in the order kvpress stores them
    #: (its topk order; parity reports compare it).
    order: list[list[np.ndarray] | None] | None = None


@dataclass
class DecodingRun:
    """A greedy continuation under a decoding policy, with the cache's size at every step."""

    policy: DecodingPolicy
    tokens: list[int]
    steps: list[DecodeStep] = field(default_factory=list)
    compressions: list[Compression] = field(default_factory=list)
    start_rows: list[int] = field(default_factory=list)
    start_bytes: int = 0
    #: [layer][kv_head] the positions the state held before decoding (None for a layer stored whole), and how many
    #: positions were written before it: the k-th token appended sits at position n_start + k − 1.
    start_kept: list[list[np.ndarray] | None] = field(default_factory=list)
    n_start: int = 0
    interrupted: bool = False  # Ctrl-C stopped the decode: `tokens` holds what was generated until then
    #: Wall time of the checks while decoding: from the evaluated step before each to its evaluated result
    #: (scoring, ranking and the gathers), so decode time and eviction time can be told apart.
    evict_seconds: float = 0.0
    #: With decode_with_policy(keep_cache=True): the cache after the last token (tests, replays).
    cache: list[Any] | None = field(default=None, repr=False)

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
    keep_scores: bool = False,
    forced: Sequence[int] | None = None,
    on_logits: Callable[[mx.array], None] | None = None,
    keep_cache: bool = False,
) -> DecodingRun:
    """n greedy tokens from a copy of `state`'s cache (the state is not changed), evicting as `policy` says.

    Starts as `Session.continuation` does: under "paper" the first token is the dense prefill's, under "mlx-lm"
    the last prompt token is fed first. keep_scores: record what a re-scoring policy scored at each eviction
    (`Compression.held` / `scores`). forced: teacher forcing — feed these tokens (e.g. the dense continuation)
    instead of the argmax, which `tokens` still records; on_logits receives each step's next-token logits
    [vocab] (for KL against the dense side); keep_cache: leave the final cache on the run. Uses the session's public members only; call it on the session's
    thread.
    """
    if n < 1:
        raise ValueError(f"tokens to generate must be at least 1, got {n}")
    if not session.dense_tokens:
        raise ValueError("no prefill: prefill a prompt before decoding")
    if any(isinstance(c, ResidualKVCache) for c in state.cache):
        raise ValueError(
            "decoding policies evict from plain sparse caches: drop fp_recent (the float residual) to use one"
        )
    if (policy.rescores or policy.method == "cam") and session.info.latent_rope_dim:
        raise ValueError(
            f"{policy.method} re-scores from queries and keys, which latent attention (MLA) layers do not "
            "store per head: choose streaming_llm or knorm (not in the kvpress form)"
        )
    cache = caches.copy_cache(state.cache)
    run = DecodingRun(policy, [], start_rows=_rows(cache), start_bytes=caches.cache_tensor_bytes(cache))
    evictor = _Evictor(policy, run, cache, session, state, keep_scores)
    run.n_start = evictor.n_start
    run.start_kept = [_int32(p) for p in map(_positions, cache)]
    if policy.evict_before_decoding:
        cache = evictor.evict(cache, 0)
    elif evictor.rescorer is not None:  # h2o_online still starts from the prompt's sums
        evictor.seed(cache)
    if state.config.schedule == "paper":
        feed, run.tokens = session.dense_tokens[0], [session.dense_tokens[0]]
    else:
        feed = session.prompt_ids[-1]
    if should_cancel is not None and should_cancel():
        raise DecodeCancelled(f"generation cancelled after {len(run.tokens)} of {n} tokens", run)
    # Pipelined as Session._greedy: step i + 1 is queued before token i is read back. An eviction waits for the
    # queued step (its gathers read the rows that step wrote), then the next step runs on the evicted cache.
    # Ctrl-C (KeyboardInterrupt) ends the decode with what was generated (`interrupted`); a cancel raises.
    try:
        cache = _decode(
            session, cache, policy, run, evictor, feed, n, should_cancel, on_progress, forced, on_logits
        )
    except KeyboardInterrupt:
        run.interrupted = True
    if keep_cache:
        run.cache = cache
    return run


def _decode(
    session: Any,
    cache: list[Any],
    policy: DecodingPolicy,
    run: DecodingRun,
    evictor: _Evictor,
    feed: int,
    n: int,
    should_cancel: Callable[[], bool] | None,
    on_progress: Callable[[int, int], None] | None,
    forced: Sequence[int] | None = None,
    on_logits: Callable[[mx.array], None] | None = None,
) -> list[Any]:
    def step(cache: list[Any], y: mx.array) -> mx.array:
        if forced is not None:  # the token fed is forced[k] when the k-th token was predicted
            index = len(run.tokens) + (0 if y is first else 1)
            y = mx.array([[forced[index - 1]]]) if 0 < index <= len(forced) else y
        return _step(session, cache, y, on_logits)

    first = mx.array([[feed]])
    with evictor.observing():
        pending = step(cache, first) if len(run.tokens) < n else None
        appended = 0
        while pending is not None:
            appended += 1
            rows, size = _rows(cache), caches.cache_tensor_bytes(cache)
            evict = appended % policy.interval == 0 or evictor.deferred
            if evict:
                mx.eval(pending)
                start = time.perf_counter()
                cache = evictor.evict(cache, appended)
                mx.eval([c.state for c in cache if getattr(c, "keys", None) is not None])
                run.evict_seconds += time.perf_counter() - start
            run.steps.append(DecodeStep(appended, rows, size, evict))
            following = step(cache, pending) if len(run.tokens) + 1 < n else None
            run.tokens.append(int(pending.item()))
            if on_progress is not None:
                on_progress(len(run.tokens), n)
            if following is not None and should_cancel is not None and should_cancel():
                raise DecodeCancelled(f"generation cancelled after {len(run.tokens)} of {n} tokens", run)
            pending = following
    return cache


def _step(
    session: Any, cache: list[Any], y: mx.array, on_logits: Callable[[mx.array], None] | None = None
) -> mx.array:
    """Feed token(s) `y` [1, 1] through `cache` (appending a row) and queue the greedy next token [1, 1]."""
    logits = session.model(y, cache=cache)
    session.forward_calls += 1
    if on_logits is not None:
        on_logits(logits[0, -1])
    out = mx.argmax(logits[:, -1], axis=-1, keepdims=True)
    mx.async_eval(out)
    return out


class _Evictor:
    """The checks of one decode: every compressible layer down to the policy's target with select_positions; a
    re-scoring policy also records the fed tokens' queries (kvcore.model.attention.observing) for its window."""

    def __init__(
        self, policy: DecodingPolicy, run: DecodingRun, cache: list[Any], session: Any, state: Any, keep: bool
    ) -> None:
        self.policy, self.run, self.keep = policy, run, keep
        self.deferred = False  # a re-scoring check waits for a generated token's queries
        self.rescorer = None
        self.buffer = None
        self.merger = CacheMerger(policy.merge_budget) if policy.method == "cam" else None
        self.last_eviction = 0  # step of the last eviction (cam merges the rows evicted since)
        if policy.rescores:
            rope_of = (lambda i: session.model.layers[i].self_attn.rope) if policy.kvpress_form else None
            self.rescorer = Rescorer(
                policy.method,
                session.observations(state.config.schedule),
                window=policy.window,
                rope_of=rope_of,
            )
            self.buffer = QueryBuffer(cache) if self.rescorer.reads_queries else None
        if self.merger is not None:
            self.buffer = QueryBuffer(cache)
        first = next((c for c in cache if _positions(c) is not None), None)
        self.n_start = 0 if first is None else int(first.offset)  # positions written before decoding

    def observing(self) -> Any:
        return attention.observing(self.buffer) if self.buffer is not None else nullcontext()

    def evict(self, cache: list[Any], step: int) -> list[Any]:
        """Drop every compressible layer to the target; records a Compression when it did."""
        policy, rescorer = self.policy, self.rescorer
        target = policy.target(self.n_start + step)
        self.deferred = False
        indices: list[Any] = []
        held: list[list[np.ndarray] | None] = []
        scores: list[list[np.ndarray] | None] = []
        plans: dict[int, Any] = {}
        for i, layer in enumerate(cache):
            positions = _positions(layer)
            held.append(positions)
            scores.append(None)
            if positions is None:
                indices.append(None)
                continue
            if self.merger is not None:
                assert self.buffer is not None
                queries = self.buffer.take(i) if step else None
                self.merger.accumulate(i, layer, positions, queries, self.buffer.scale.get(i, 1.0))
                keep = policy.keep_rows(layer, positions, target)
                if keep is not None:
                    plans[i] = self.merger.plan(i, layer, positions, keep, step - self.last_eviction)
                indices.append(keep)
                continue
            if rescorer is None:
                indices.append(policy.keep_rows(layer, positions, target))
                continue
            if step == 0:
                queries, scale = rescorer.seed(i, layer, positions), self._prompt_scale(i)
            elif self.buffer is not None:
                queries, scale = self.buffer.take(i), self.buffer.scale.get(i, 1.0)
            else:
                queries, scale = None, 1.0
            rescorer.accumulate(i, layer, positions, queries, scale)
            over = max(len(p) for p in positions) > target
            if over and rescorer.reads_queries and queries is None and not rescorer.online:
                self.deferred = True  # no query of these rows yet: evict after the next token
                indices.append(None)
                continue
            indices.append(rescorer.keep_rows(i, layer, positions, queries, target, scale))
            scores[i] = rescorer.last_scores
        if all(i is None for i in indices):
            return cache
        cache = caches.select_positions(cache, indices)
        self.last_eviction = step
        merges: list[list[CamMerge] | None] | None = None
        if self.merger is not None:
            merges = [None] * len(cache)
            for i, plan in plans.items():
                self.merger.apply(i, cache[i], _positions(cache[i]), indices[i], plan)
                merges[i] = plan.merges
        if self.buffer is not None:
            self.buffer.bind(cache)
        kept = [None if p is None else _int32(_positions(c)) for c, p in zip(cache, held, strict=True)]
        detail = self.keep and rescorer is not None
        self.run.compressions.append(
            Compression(
                step,
                kept,
                _rows(cache),
                caches.cache_tensor_bytes(cache),
                held=[_int32(p) for p in held] if detail else None,
                scores=scores if detail else None,
                merges=merges,
                order=self._kvpress_orders(indices) if detail and policy.kvpress_form else None,
            )
        )
        return cache

    def _kvpress_orders(self, indices: list[Any]) -> list[list[np.ndarray] | None]:
        """Per layer and kv-head, the kept positions in kvpress's stored order (None for a layer this eviction
        left alone)."""
        assert self.rescorer is not None
        order = self.rescorer.kvpress_order
        return [
            None
            if rows is None or (i, 0) not in order
            else [np.array(order[i, h], np.int32) for h in range(len(rows))]
            for i, rows in enumerate(indices)
        ]

    def seed(self, cache: list[Any]) -> None:
        """The re-scoring state before decoding, without an eviction."""
        assert self.rescorer is not None
        for i, layer in enumerate(cache):
            positions = _positions(layer)
            if positions is not None:
                self.rescorer.seed(i, layer, positions)

    def _prompt_scale(self, layer: int) -> float:
        assert self.rescorer is not None
        obs = self.rescorer.prompt[layer] if layer < len(self.rescorer.prompt) else None
        return 1.0 if obs is None else obs.scale


def _positions(layer: Any) -> list[np.ndarray] | None:
    """Per kv-head logical positions of the stored rows, in row order; None for a layer stored whole."""
    if caches.incompressible_reason(layer) is not None or getattr(layer, "keys", None) is None:
        return None
    if hasattr(layer, "retained_positions"):
        return [np.asarray(p) for p in layer.retained_positions]
    keys = layer.keys[0] if isinstance(layer.keys, tuple | list) else layer.keys
    n_heads = int(keys.shape[1])
    return [np.arange(layer.offset, dtype=np.int32)] * n_heads


def _int32(positions: list[np.ndarray] | None) -> list[np.ndarray] | None:
    """Per-head positions as their own int32 arrays (a record that outlives the cache)."""
    return None if positions is None else [np.array(p, dtype=np.int32) for p in positions]


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
