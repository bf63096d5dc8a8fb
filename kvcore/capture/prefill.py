"""Prefill a prompt once and record, per layer, what the compression methods score from.

`mx.fast.scaled_dot_product_attention` returns no attention weights (mlx issue 2590), so an observer installed
through `kvcore.model.attention` sees each layer's post-RoPE queries and cached keys and keeps:

- the last `window` queries (snapkv, pyramidkv, tova score from them after prefill);
- h2o's column sums of the causal softmax attention over *all* prompt queries, accumulated chunk by chunk and in
  blocks of queries, so no [T, T] matrix per head is ever held at once. That costs far more than the prefill on a
  CPU (MLX's CPU `exp` runs at ~25 M/s: ~8.5 s per 32-head layer at 4k tokens), so `h2o="lazy"` only keeps each
  chunk's queries (in the model's dtype) and `LayerObservation.ensure_h2o()` computes the same sums, bit for bit,
  the first time a method asks; the queries are dropped then. Memory until then: H_q/(2·H_kv) × the dense cache.
  `h2o="auto"` (Session's) keeps the queries on a CPU; on CUDA it computes eager sums with kvcore's fused kernels
  (`kvcore.kernels.h2o_sums`: no score is written, no query kept); on another GPU (Metal) it keeps the queries
  while they fit in a share of its free memory, else computes eager sums (`kvcore.capture.h2o_mode`, logged); eager
  work is queued with `mx.async_eval`;
- expected_attention's pre-RoPE query statistics (`kvcore.capture.query_stats`: rope modules tapped for the capture,
  running mean and covariance, the mean future RoPE rotation), unless `query_stats=False` or the model has latent
  (MLA) layers, whose queries expected_attention does not score (`Session.check_config` refuses it there).

Nothing blocks inside the observer: the recorded arrays are queued with `mx.async_eval` as each layer is seen (so
the graph does not hold every layer's queries until the chunk ends) and the host never waits per layer.

Keys themselves are not copied: after prefill they are read from the cache (post-RoPE, as mlx-lm stores them).
A latent (MLA) layer is observed as attention uses it (`kvcore.model.mla`): one kv-head shared by every query head,
queries `[embed_q(q_nope), q_pe]` and keys `[latent, k_pe]`, so its scores are the real attention weights over
the cached latent rows; its keys are that concatenation of the cached latent and RoPE rows.
Layers whose cache is not a plain mlx-lm `KVCache` (sliding window, SSM state, quantized) get no observation.

`hold_last=True` feeds the prompt's last token in a forward call of its own and keeps what was observed before
it (`CaptureResult.before_last`): one prefill then serves both compression schedules (`kvcore.defaults`) — the
whole prompt for "paper", the prompt minus its last token for "mlx-lm" — and the dense cache after the last
token is exactly the one mlx-lm's `generate_step` builds (it prefills T − 1 tokens and steps the last one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

from kvcore import defaults
from kvcore.cache import sparse as caches
from kvcore.capture import h2o_mode as capture_mode
from kvcore.capture import query_stats as query_stats_module
from kvcore.defaults import DEFAULT_WINDOW, PREFILL_SCORES
from kvcore.kernels import h2o_sums
from kvcore.model import attention, mla

# Upper bound on the elements of one block of attention probabilities [H_q, block, T] (64 MiB in float32).
BLOCK_ELEMENTS = 1 << 24


class Cancelled(Exception):
    """The user cancelled: `should_cancel()` said so between two chunks or tokens, or an app job was stopped.

    The one cancellation type of engine and app, so a cancel raised anywhere reaches the app as "Cancelled"."""


@dataclass
class LayerObservation:
    """What one plain-KVCache layer saw during prefill; float32 but `keys` (cache dtype) and `window_queries` and
    `pending_queries` (the model's dtype, as the queries came)."""

    keys: mx.array  # [H_kv, T, head_dim], post-RoPE, a view of the cache (latent: [1, T, r+p], a copy)
    window_queries: mx.array  # [H_q, w, head_dim], post-RoPE, w = min(window, T) (latent: head_dim r+p)
    h2o_sums: mx.array | None  # [H_q, T]: column sums of causal softmax attention over all T prompt queries
    n_q_heads: int
    n_kv_heads: int
    scale: float
    pending_queries: list[mx.array] | None = (
        None  # h2o="lazy": every chunk's queries [H_q, N, D], model dtype
    )
    latent: bool = False  # an MLA layer observed in latent space (kvcore.model.mla)
    values: mx.array | None = None  # [H_kv, T, head_dim], a view of the cache (latent: None)
    query_stats: query_stats_module.QueryStats | None = None  # pre-RoPE statistics (expected_attention)
    rope: Any = (
        None  # the layer's own rope module (un-rotates cached keys: leverage, compactor); None if untapped
    )
    #: the layer's attention output projection (the model's `o_proj` module, not a copy), for criticalkv's
    #: ‖W_o·v‖₁; None where the architecture names it otherwise
    output_proj: Any = None
    #: Scores from an extra forward pass (kvzip: `Method.reconstruct`), by what they depend on; [H_kv, T] float32.
    reconstruction: dict[tuple, mx.array] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return self.keys.shape[1]

    @property
    def group(self) -> int:
        """Query heads per kv-head (GQA); query head h reads kv-head h // group."""
        return self.n_q_heads // self.n_kv_heads

    def ensure_h2o(self) -> mx.array | None:
        """Compute the h2o sums from the kept queries if capture deferred them; identical to eager capture. The
        queries stay for the methods that read them all (non_causal_attention, compactor) unless they are larger
        than `defaults.KEEP_PROMPT_QUERIES_BYTES`: then they are freed (a long prompt's queries rival its cache)."""
        if self.h2o_sums is None and self.pending_queries:
            sums, stop = None, 0
            for q in self.pending_queries:
                stop += q.shape[1]
                sums = _accumulate_h2o(sums, q, self.keys[:, :stop], self.scale)
            self.h2o_sums = sums
            if sum(q.nbytes for q in self.pending_queries) > defaults.KEEP_PROMPT_QUERIES_BYTES:
                self.pending_queries = None
        return self.h2o_sums


@dataclass
class CaptureResult:
    cache: list[Any]
    observations: list[LayerObservation | None]
    skipped: dict[int, str]  # layer -> why it has no observation
    logits: mx.array  # [vocab] at the last prompt position
    forward_calls: int
    n_tokens: int
    before_last: CaptureResult | None = None  # hold_last=True: the same prefill one token earlier
    h2o_mode: str = ""  # "eager", "lazy" or "off": how this prefill recorded h2o's sums


@dataclass
class _LayerState:
    tail: mx.array | None = None  # [H_q, <=window, D], the model's dtype
    sums: mx.array | None = None  # [H_q, T_so_far]
    queries: list[mx.array] = field(default_factory=list)  # h2o="lazy" only
    n_q_heads: int = 0
    n_kv_heads: int = 0
    scale: float = 1.0
    latent: bool = False
    stats: query_stats_module.QueryStats | None = None
    rope: Any = None  # the rope module the layer's queries went through (its own, for the future rotation)
    untapped: bool = False  # some chunk's queries did not come from a tapped rope: no statistics


@dataclass
class _Recorder:
    """The observer: maps each cache object to its layer and updates that layer's state."""

    layer_of: dict[int, int]
    window: int
    h2o: bool | str
    taps: query_stats_module.Taps | None = None
    states: dict[int, _LayerState] = field(default_factory=dict)

    def __call__(self, queries, keys, values, cache, scale, mask, latent=False) -> None:
        found = None if self.taps is None else self.taps.pre_rope(queries)
        layer = self.layer_of.get(id(cache))
        if layer is None:
            return
        state = self.states.setdefault(layer, _LayerState())
        state.latent = latent
        state.n_q_heads, state.n_kv_heads, state.scale = queries.shape[1], keys.shape[1], float(scale)
        # In the model's dtype, as the queries came (float32 copies would double the window's memory, twice over:
        # the result and before_last each hold one); scoring casts it, which gives the same float32 values.
        tail = queries[0] if state.tail is None else mx.concatenate([state.tail, queries[0]], axis=1)
        # A compact copy: a slice would keep the whole chunk's queries alive (H_q·chunk·D per layer).
        state.tail = mx.contiguous(tail[:, -self.window :])
        if self.h2o == "lazy":
            state.queries.append(queries[0])
        elif self.h2o:
            state.sums = _accumulate_h2o(state.sums, queries[0], keys[0], float(scale), wait=False)
        # Queued now, not with the chunk's logits: otherwise the graph keeps every layer's chunk of queries alive
        # until the end of the chunk (2x the chunk's dense cache for 32 q / 8 kv heads).
        mx.async_eval(state.tail)
        if self.taps is not None:
            if found is None or latent or state.untapped:
                state.untapped, state.stats = True, None
            else:
                first = keys.shape[2] - queries.shape[2]
                state.stats, state.rope = (
                    query_stats_module.accumulate(state.stats, found[0][0], first),
                    found[1],
                )
                mx.async_eval(state.stats.arrays())  # the same reason: the chunk's pre-RoPE queries are freed

    def snapshot(self) -> dict[int, _LayerState]:
        """The states as they are now (arrays are immutable: later chunks rebind, never overwrite them)."""
        return {
            layer: _LayerState(
                s.tail,
                s.sums,
                list(s.queries),
                s.n_q_heads,
                s.n_kv_heads,
                s.scale,
                s.latent,
                s.stats,
                s.rope,
                s.untapped,
            )
            for layer, s in self.states.items()
        }

    def arrays(self) -> list[mx.array]:
        """What must be evaluated with each chunk: the tails, h2o's sums, expected_attention's statistics and the
        queries kept for lazy h2o (all already queued with `mx.async_eval`, but for those queries)."""
        out = [s.tail for s in self.states.values() if s.tail is not None]
        out += [s.sums for s in self.states.values() if s.sums is not None]
        out += [a for s in self.states.values() if s.stats is not None for a in s.stats.arrays()]
        return out + [s.queries[-1] for s in self.states.values() if s.queries]


def _accumulate_h2o(
    sums: mx.array | None, q: mx.array, keys: mx.array, scale: float, wait: bool = True
) -> mx.array:
    """Add the column sums of this chunk's causal softmax attention to `sums`, one block of queries at a time.

    q: [H_q, N, D] (the model's dtype) are the last N of the T_k positions whose keys [H_kv, T_k, D] are cached.
    On CUDA with 16-bit queries the fused kernels of `kvcore.kernels.h2o_sums` compute the sums without writing
    a score; otherwise each block of float32 probabilities is evaluated before the next is built (bounded
    memory). wait=False queues the work (`mx.async_eval`) instead of blocking, so capture inside the forward pass
    never stalls the host.
    """
    evaluate = mx.eval if wait else mx.async_eval
    if h2o_sums.applies(q, keys):
        total = h2o_sums.accumulate(sums, q, keys, scale)
        evaluate(total)
        return total
    q = q.astype(mx.float32)
    n_q_heads, n_new, head_dim = q.shape
    n_kv_heads, n_keys, _ = keys.shape
    group = n_q_heads // n_kv_heads
    k_t = keys.astype(mx.float32).transpose(0, 2, 1)[:, None]  # [H_kv, 1, D, T_k]
    qg = (q * scale).reshape(n_kv_heads, group, n_new, head_dim)
    first = n_keys - n_new
    block = max(1, BLOCK_ELEMENTS // (n_q_heads * n_keys))
    key_pos = mx.arange(n_keys)
    total = mx.zeros((n_q_heads, n_keys), mx.float32)
    if sums is not None:
        total = total + mx.pad(sums, [(0, 0), (0, n_keys - sums.shape[1])])
    for start in range(0, n_new, block):
        stop = min(start + block, n_new)
        n_visible = first + stop  # keys after the block's last query are masked for all of it: skip them
        logits = qg[:, :, start:stop] @ k_t[..., :n_visible]  # [H_kv, group, b, n_visible]
        visible = key_pos[None, :n_visible] <= (first + mx.arange(start, stop))[:, None]
        probs = mx.softmax(mx.where(visible, logits, -mx.inf), axis=-1, precise=True)
        column_sums = probs.sum(axis=2).reshape(n_q_heads, n_visible)
        total = total + mx.pad(column_sums, [(0, 0), (0, n_keys - n_visible)])
        evaluate(total)
    return total


def _kept_query_bytes(model: nn.Module, n_tokens: int) -> int | None:
    """What lazy h2o would keep for this prompt: every layer's H_q queries of head_dim, in a 2-byte dtype."""
    args = getattr(model, "args", None)
    heads = getattr(args, "num_attention_heads", None)
    layers = getattr(args, "num_hidden_layers", None)
    if not isinstance(heads, int) or not isinstance(layers, int):
        return None
    head_dim = getattr(args, "head_dim", None) or getattr(args, "hidden_size", 0) // heads
    return layers * heads * n_tokens * int(head_dim) * 2 if head_dim else None


def _layer_map(cache: Sequence[Any]) -> tuple[dict[int, int], dict[int, str]]:
    layer_of, skipped = {}, {}
    for i, c in enumerate(cache):
        if type(c) is KVCache:
            layer_of[id(c)] = i
        else:
            skipped[i] = f"{type(c).__name__} is not a plain KVCache: not captured, not compressible"
    return layer_of, skipped


def _query_heads(model: nn.Module) -> int | None:
    """The model's query heads from its config (None when it does not say: chunks are then never shortened)."""
    heads = getattr(getattr(model, "args", None), "num_attention_heads", None)
    return heads if isinstance(heads, int) and heads > 0 else None


def _spans(body: int, chunk_size: int, heads: int | None, max_scores: int) -> list[tuple[int, int]]:
    """[a, b) chunks over `body` tokens: `chunk_size` each, shorter where heads x chunk x (a + chunk) keys would
    pass `max_scores` (never below one token)."""
    spans, a = [], 0
    while a < body:
        size = (
            chunk_size if heads is None else min(chunk_size, max(1, max_scores // (heads * (a + chunk_size))))
        )
        spans.append((a, min(a + size, body)))
        a += size
    return spans


def prefill_with_capture(
    model: nn.Module,
    prompt_ids: Sequence[int],
    cache: list[Any] | None = None,
    window: int = DEFAULT_WINDOW,
    chunk_size: int = 2048,
    h2o: bool | str = True,
    hold_last: bool = False,
    query_stats: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    max_scores: int = PREFILL_SCORES,
) -> CaptureResult:
    """Prefill `prompt_ids` into a fresh (or given, empty) cache in chunks, recording per-layer observations.

    Chunks are `chunk_size` tokens, shorter where query heads x chunk x keys would pass `max_scores` (a long
    prompt's later chunks).

    h2o: True or "eager" computes the h2o sums now, False never, "lazy" keeps the queries so `ensure_h2o()` can on
    demand, "auto" chooses eager or lazy by backend (`kvcore.capture.h2o_mode`) and logs which and why.
    hold_last: feed the last token alone and keep the state before it as `before_last` (module docstring).
    query_stats: record expected_attention's pre-RoPE query statistics (False: the capture without them).
    Raises ValueError on an empty prompt, a token id outside the vocabulary or a window/chunk size below 1,
    `Cancelled` when `should_cancel()` says so between chunks, and `attention.UnsupportedArchitecture` when
    attention cannot be observed.
    """
    ids = list(prompt_ids)
    if not ids:
        raise ValueError("prompt is empty: at least 1 token is needed")
    if window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
    if h2o not in (True, False, "lazy", "eager", "auto"):
        raise ValueError(f"h2o must be True, False, 'eager', 'lazy' or 'auto', got {h2o!r}")
    _check_ids(ids, getattr(getattr(model, "args", None), "vocab_size", None))
    if h2o == "auto":
        chosen, why = capture_mode.resolve("auto", _kept_query_bytes(model, len(ids)))
        capture_mode.log.info("h2o capture: %s (%s)", chosen, why)
        h2o = chosen
    h2o = True if h2o == "eager" else h2o
    attention.install(model)
    cache = make_prompt_cache(model) if cache is None else cache
    layer_of, skipped = _layer_map(cache)
    # A latent model's queries never reach attention as a rope output: nothing to tap (check_config refuses it).
    taps = query_stats_module.Taps() if query_stats and mla.latent_dims(model) is None else None
    recorder = _Recorder(layer_of, window, h2o, taps)
    total = len(ids)
    body = total - 1 if hold_last and total > 1 else total
    spans = _spans(body, chunk_size, _query_heads(model), max_scores)
    calls, logits, before_last = 0, None, None
    tapping = query_stats_module.tapped(model, taps) if taps is not None else nullcontext()
    with tapping, attention.observing(recorder):
        for a, b in spans + ([(body, total)] if body < total else []):
            if should_cancel is not None and should_cancel():
                raise Cancelled(f"prefill cancelled after {a} of {total} tokens")
            if a == body:  # the held-back last token: keep what was seen before it
                before_last = _result(
                    _prefix_cache(cache, layer_of), layer_of, recorder.snapshot(), dict(skipped), logits
                )
                before_last.forward_calls, before_last.n_tokens = calls, body
            out = model(mx.array([ids[a:b]]), cache=cache)
            calls += 1
            # Only the chunks whose last logits are kept evaluate the LM head ([N, vocab]); as in mlx-lm's own
            # prefill, the others never compute it.
            keep = b in (body, total)
            # A copy of the one row kept: a slice would hold the chunk's whole [N, vocab] logits buffer alive
            # (0.5 GiB at a 2048-token chunk of a 128k vocabulary, 0.12x an 8B model's dense cache at 32k).
            logits = mx.contiguous(out[0, -1]) if keep else logits
            mx.eval([c.state for c in cache], recorder.arrays(), *([logits] if keep else []))
            del out  # nor keep it (or its lazy graph) alive through the next chunk's forward pass
            if on_progress is not None:
                on_progress(b, total)
    result = _result(cache, layer_of, recorder.states, skipped, logits)
    result.forward_calls, result.n_tokens, result.before_last = calls, total, before_last
    attach_output_projections(model, [result, before_last])
    for r in (result, before_last):
        if r is not None:
            r.h2o_mode = "lazy" if h2o == "lazy" else "eager" if h2o else "off"
    if before_last is not None:
        before_last.cache = [
            _trimmed(c, body) if i in layer_of.values() else c for i, c in enumerate(before_last.cache)
        ]
        _observe_keys(before_last, before_last.cache)
    return result


def attach_output_projections(model: nn.Module, results: list[CaptureResult | None]) -> None:
    """Point each observation at its layer's `self_attn.o_proj` (mlx-lm's name in llama, qwen, mistral, phi3,
    gemma): the observer sees attention's inputs, not the module, so the model is where the weights are."""
    layers = getattr(model, "layers", None)
    if layers is None:
        return
    for r in results:
        if r is None:
            continue
        for obs, layer in zip(r.observations, layers, strict=False):
            if obs is not None and not obs.latent:
                obs.output_proj = getattr(getattr(layer, "self_attn", None), "o_proj", None)


def _check_ids(ids: list[int], vocab_size: Any) -> None:
    """Refuse ids outside the embedding table: MLX's gather does not bound-check, so such an id silently reads
    whatever memory lies past the table (freed buffers of earlier arrays: results that change from run to run)."""
    if not isinstance(vocab_size, int):
        return
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(
            f"token id {bad} is outside the model's vocabulary (0 to {vocab_size - 1}): "
            "encode the prompt with this model's tokenizer"
        )


def _prefix_cache(cache: list[Any], layer_of: dict[int, int]) -> list[Any]:
    """Before the last token: plain layers are trimmed later (views); the others are copied now (small states)."""
    plain = set(layer_of.values())
    copied = caches.copy_cache([c for i, c in enumerate(cache) if i not in plain])
    it = iter(copied)
    return [c if i in plain else next(it) for i, c in enumerate(cache)]


def _trimmed(layer: KVCache, n: int) -> KVCache:
    """A KVCache holding the first n positions of `layer` (views; appending to it never touches `layer`)."""
    out = KVCache()
    out.keys, out.values, out.offset = layer.keys[..., :n, :], layer.values[..., :n, :], n
    return out


def _result(
    cache: list[Any],
    layer_of: dict[int, int],
    states: dict[int, _LayerState],
    skipped: dict[int, str],
    logits: mx.array | None,
) -> CaptureResult:
    observations: list[LayerObservation | None] = [None] * len(cache)
    for layer in range(len(cache)):
        if layer not in layer_of.values():
            continue
        state = states.get(layer)
        if state is None:
            skipped[layer] = "attention of this layer was never observed"
            continue
        observations[layer] = LayerObservation(
            keys=mx.zeros((0,)),
            window_queries=state.tail,
            h2o_sums=state.sums,
            n_q_heads=state.n_q_heads,
            n_kv_heads=state.n_kv_heads,
            scale=state.scale,
            pending_queries=state.queries or None,
            latent=state.latent,
            query_stats=_finished(state),
            rope=None if state.untapped else state.rope,
        )
    result = CaptureResult(cache, observations, skipped, logits, 0, 0)
    _observe_keys(result, cache)
    return result


def _finished(state: _LayerState) -> query_stats_module.QueryStats | None:
    """The layer's statistics, holding its rope module for the rotation computed on first use; or None."""
    stats = state.stats
    if stats is None or state.untapped or state.rope is None:
        return None
    return replace(stats, rope=state.rope)


def _observe_keys(result: CaptureResult, cache: list[Any]) -> None:
    """Point each observation at its layer's cached keys (post-RoPE) and values, up to the layer's offset."""
    for obs, layer_cache in zip(result.observations, cache, strict=True):
        if obs is not None and layer_cache.keys is not None:
            if obs.latent:
                obs.keys = mla.cached_keys(layer_cache)
            else:
                obs.keys = layer_cache.keys[0, :, : layer_cache.offset]
                obs.values = layer_cache.values[0, :, : layer_cache.offset]
