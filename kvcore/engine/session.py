"""A model session: load once, prefill a prompt once, then compress and regenerate as often as the user likes.

The dense cache, the captured observations and each method's ranking are kept, so a new retention ratio or
bit width is a top-n slice, a gather and a quantize — never a second prefill. h2o's sums (costly on a CPU) are
computed on a CPU from the kept prefill queries the first time h2o is asked for, on a GPU during the prefill
(`kvcore.capture.h2o_mode`). The dense greedy
continuation is computed once and is the reference every compressed state is measured against.

Schedules (`kvcore.defaults.SCHEDULES`, a field of every config): "paper" compresses the whole prompt with the
observation windows ending at its last token and takes the first generated token from the dense prefill, as
SnapKV, PyramidKV and kvpress do; "mlx-lm" compresses the prompt minus its last token and feeds that token through
the compressed cache. The last prompt token is the query that retrieves an answer, so only "paper" lets a
query-aware method see it. One prefill serves both (`prefill_with_capture(hold_last=True)`), so switching is a
recompress; the dense reference of each schedule is computed once per continuation.

MLX streams belong to the thread that created them, so a Session must be used from the thread that loaded it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache import sparse as caches
from kvcore.cache.kivi import KiviKVCache, kivi_cache
from kvcore.cache.residual import ResidualKVCache, split_select
from kvcore.capture.prefill import Cancelled, CaptureResult, prefill_with_capture
from kvcore.defaults import (
    CAPTURE_WINDOW,
    DEFAULT_BITS,
    DEFAULT_CONTINUATION_TOKENS,
    DEFAULT_EDGE_BITS,
    DEFAULT_EDGE_LAYERS,
    DEFAULT_FP_RECENT,
    DEFAULT_GROUP_SIZE,
    DEFAULT_H2O_CAPTURE,
    DEFAULT_KERNEL,
    DEFAULT_LAYER_BITS,
    DEFAULT_METHOD,
    DEFAULT_N_SINK,
    DEFAULT_PER_HEAD,
    DEFAULT_QUANT,
    DEFAULT_RATIO,
    DEFAULT_SCHEDULE,
    DEFAULT_SEED,
    DEFAULT_VALUE_BITS,
    DEFAULT_WINDOW,
    REFERENCE_CHUNK,
    SCHEDULES,
    UNQUANTIZED_BITS,
    bits_or_none,
)
from kvcore.engine.questions import Answer, Question
from kvcore.measure import metrics
from kvcore.methods import Method, available, calibration
from kvcore.methods import get as get_method
from kvcore.methods.base import window_attention
from kvcore.methods.selection import Ranking, budget_note, device_select, rank, select, selects_on_device
from kvcore.model import checks as model_checks
from kvcore.model import loading, prompting
from kvcore.quant import QuantScheme
from kvcore.quant import get as get_scheme

Progress = Callable[[int, int], None] | None
CancelCheck = Callable[[], bool] | None

#: Everything a prefill replaces; restored as it was when the prefill fails or is cancelled.
_PREFILL_STATE = (
    "_capture",
    "prompt_ids",
    "_rankings",
    "_window_attention",
    "dense_tokens",
    "_dense_logits",
    "_dense_decode_cache",
    "_packed",
    "chat_template_applied",
)

#: The configuration's fields that set the method parameter of the same name, where the method declares one.
_BOUND = ("window", "n_sink", "kernel", "seed")
#: The bound parameters with a CSV column of their own (the rest go in "method_params").
_COLUMNS = ("window", "n_sink", "kernel")

__all__ = ["Cancelled", "CompressedState", "CompressionConfig", "Regeneration", "Session", "context_refusal"]

#: How a refusal names the opt-in that lets a generation run past the model's trained context.
BEYOND_CONTEXT_FIX = (
    "or generate past it on purpose with --beyond-context (RoPE extrapolates; the quality past the trained "
    "context is yours to judge)"
)


def context_refusal(
    n_prompt: int, n_tokens: int, ctx: int | None, beyond_context: bool = False
) -> str | None:
    """Why `n_prompt` prompt tokens plus `n_tokens` generated ones do not fit the model's trained context `ctx`
    (max_position_embeddings), naming both fixes; None when they fit, when `ctx` is unknown, or when
    `beyond_context` opts in to positions the model was never trained on."""
    if ctx is None or beyond_context or n_prompt + n_tokens <= ctx:
        return None
    room = ctx - n_prompt
    fit = (
        f"generate at most {room} tokens or shorten the prompt by {n_prompt + n_tokens - ctx}"
        if room > 0
        else f"shorten the prompt by {n_prompt + n_tokens - ctx} tokens"
    )
    return (
        f"prompt has {n_prompt} tokens and {n_tokens} more are to be generated, but the model's context is {ctx} "
        f"(max_position_embeddings): {fit}, {BEYOND_CONTEXT_FIX}"
    )


@dataclass(frozen=True)
class CompressionConfig:
    """One point in the space the sliders span. bits None means unquantized keys (the UI's 16).

    `bits` is the keys' width and `value_bits` the values' (None: the same as `bits`; 16: unquantized), so 8-bit
    keys with 4-bit values is `bits=8, value_bits=4`, float keys with 4-bit values `bits=None, value_bits=4` and
    4-bit keys with float values `bits=4, value_bits=16`. A value width equal to the keys' is stored as None.
    `fp_recent = R > 0` keeps the kept sinks (positions < n_sink) and the last R prompt positions float beside the
    packed rest, and decoded tokens float too (kvcore.cache.residual); it is 0 whenever nothing is packed.
    `quant` names the scheme that packs (kvcore.quant): it sets the widths and group sizes allowed, a scheme with
    one group size (mxfp4 32, nvfp4 16) fixes `group_size`. It is kept while nothing is packed, so a sweep from an
    unquantized base packs its quantized points with it.
    """

    method: str = DEFAULT_METHOD
    ratio: float = DEFAULT_RATIO
    bits: int | None = DEFAULT_BITS
    group_size: int = DEFAULT_GROUP_SIZE
    per_head: bool = DEFAULT_PER_HEAD
    window: int = DEFAULT_WINDOW
    n_sink: int = DEFAULT_N_SINK
    kernel: int = DEFAULT_KERNEL
    seed: int = DEFAULT_SEED
    schedule: str = DEFAULT_SCHEDULE
    value_bits: int | None = DEFAULT_VALUE_BITS
    fp_recent: int = DEFAULT_FP_RECENT
    #: The method's other parameters by name (beta, alpha, a new method's own); window, n_sink, kernel and seed
    #: are the fields above, given to every method that declares a parameter of that name. A dict is accepted.
    params: tuple[tuple[str, int | float], ...] = ()
    quant: str = DEFAULT_QUANT
    #: Layer-adaptive widths: a width per layer (replacing that layer's packed key and value widths; a float side
    #: stays float), or the first and last `edge_layers` layers at `edge_bits`; `layer_widths` resolves them.
    layer_bits: tuple[int, ...] = DEFAULT_LAYER_BITS
    edge_layers: int = DEFAULT_EDGE_LAYERS
    edge_bits: int = DEFAULT_EDGE_BITS

    @property
    def scheme(self) -> QuantScheme:
        """The quantization scheme at this setting's group size (built and checked once, on creation)."""
        return self._scheme

    @property
    def method_instance(self) -> Method:
        """The method with this setting's parameters (built and checked once, on creation)."""
        return self._method

    @property
    def packed_value_bits(self) -> int | None:
        """The values' packed width: `value_bits`, or `bits` when it is None; None when values stay float."""
        bits = self.bits if self.value_bits is None else self.value_bits
        return bits_or_none(bits)

    @property
    def quantized(self) -> bool:
        """Whether keys or values (or both) are packed."""
        return self.bits is not None or self.packed_value_bits is not None

    @property
    def widths(self) -> tuple[int, int]:
        """(key width, value width) as the caches take them, 16 for a float side."""
        return self.bits or UNQUANTIZED_BITS, self.packed_value_bits or UNQUANTIZED_BITS

    def layer_widths(self, n_layers: int) -> list[tuple[int, int]]:
        """(key width, value width) of each of `n_layers` layers, 16 for a float side; one-line ValueError when
        `layer_bits` does not give one width per layer."""
        kb, vb = self.widths
        if self.layer_bits and len(self.layer_bits) != n_layers:
            raise ValueError(
                f"layer_bits gives {len(self.layer_bits)} widths, the model has {n_layers} layers: give one per layer"
            )
        own = list(self.layer_bits) or [
            self.edge_bits if i < self.edge_layers or i >= n_layers - self.edge_layers else None
            for i in range(n_layers)
        ]
        return [
            (kb, vb)
            if w is None
            else (
                UNQUANTIZED_BITS if kb == UNQUANTIZED_BITS else w,
                UNQUANTIZED_BITS if vb == UNQUANTIZED_BITS else w,
            )
            for w in own
        ]

    @property
    def bits_per_layer(self) -> str:
        """The layer widths as the JSON says them: "" (every layer alike), "8,4,4,8", or "edges 2 at 8"."""
        if self.layer_bits:
            return ",".join(map(str, self.layer_bits))
        return f"edges {self.edge_layers} at {self.edge_bits}" if self.edge_layers else ""

    def group_refusal(self, head_dim: int, value_dim: int | None = None) -> str | None:
        """Why `group_size` cannot pack this model's keys (head_dim wide) or values (value_dim, default
        head_dim), or None: groups run along each packed side's width, which they must divide."""
        value_dim = value_dim or head_dim
        sides = [("head_dim", head_dim, self.bits), ("value width", value_dim, self.packed_value_bits)]
        packed = [(name, dim) for name, dim, bits in sides if bits is not None]
        for name, dim in packed:
            if dim % self.group_size:
                allowed = self._scheme.allowed_group_sizes
                ok = [g for g in allowed if all(d % g == 0 for _, d in packed)]
                return f"group size {self.group_size} does not divide {name} {dim} of this model: use one of {ok}"
        return None

    def describe(self) -> dict[str, Any]:
        """The setting as the JSON outputs (`--json`, `--positions`) name it."""
        return {
            "method": self.method,
            "schedule": self.schedule,
            "ratio": self.ratio,
            "key_bits": self.widths[0],
            "value_bits": self.widths[1],
            "fp_recent": self.fp_recent,
            "per_head": self.selects_per_head,
            "window": self.window,
            "kernel": self.kernel,
            "n_sink": self.n_sink,
            "method_params": ";".join(
                f"{name}={value}" for name, value in self._method.values().items() if name not in _COLUMNS
            ),
            "quant_scheme": self.quant,
            "execution": self._scheme.execution,
            "bits_per_layer": self.bits_per_layer,
        }

    @property
    def selects_per_head(self) -> bool:
        """Whether each kv-head keeps its own positions as run: the method's rule where it has one."""
        method = self._method
        return method.spreads_over_heads or (self.per_head and not method.shared_across_heads)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.method not in available():
            get_method(self.method)  # ValueError naming the problem and the fix; A+B chains are not listed
        if not isinstance(self.ratio, int | float) or not 0.0 < self.ratio <= 1.0:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio!r}")
        scheme = get_scheme(self.quant)  # one-line ValueError for an unknown name or parameter
        allowed_bits = scheme.allowed_bits
        who = "" if self.quant == DEFAULT_QUANT else f"{self.quant}: "
        if self.bits is not None and self.bits not in allowed_bits:
            raise ValueError(
                f"{who}bits must be one of {allowed_bits} or {UNQUANTIZED_BITS} (unquantized), got {self.bits!r}"
            )
        if self.value_bits is not None and self.value_bits not in (*allowed_bits, UNQUANTIZED_BITS):
            raise ValueError(
                f"{who}value bits must be one of {allowed_bits}, {UNQUANTIZED_BITS} (unquantized) or None "
                f"(the keys' width), got value_bits={self.value_bits!r} with bits={self.bits!r}"
            )
        if self.value_bits == (self.bits or UNQUANTIZED_BITS):
            object.__setattr__(self, "value_bits", None)  # one spelling per setting: equal widths are None
        fp = self.fp_recent
        if isinstance(fp, bool) or not isinstance(fp, int | np.integer) or fp < 0:
            raise ValueError(f"fp_recent must be a whole number of positions >= 0, got {fp!r}")
        if not self.quantized:
            object.__setattr__(self, "fp_recent", 0)  # nothing is packed, so nothing needs a float residual
        groups = scheme.allowed_group_sizes
        if len(groups) == 1:
            object.__setattr__(self, "group_size", groups[0])  # the format fixes it
        if self.group_size not in groups:
            raise ValueError(f"{who}group size must be one of {groups}, got {self.group_size!r}")
        object.__setattr__(self, "_scheme", get_scheme(self.quant, group_size=self.group_size))
        # one spelling per setting: rotated:packing=1 is rotated:packing=mxfp4
        object.__setattr__(self, "quant", self._scheme.spec)
        self._check_layer_bits(allowed_bits, who)
        if self._scheme.per_channel_keys and self.fp_recent:
            raise ValueError(
                f"{self.quant} keeps its own float residual ({self._scheme.name}:residual=R): leave fp_recent at 0"
            )
        if self.window > CAPTURE_WINDOW:
            raise ValueError(f"window must be at most {CAPTURE_WINDOW}, got {self.window!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, int | np.integer) or self.window < 1:
            raise ValueError(f"window must be an integer >= 1, got {self.window!r}")
        if isinstance(self.n_sink, bool) or not isinstance(self.n_sink, int | np.integer) or self.n_sink < 0:
            raise ValueError(f"n_sink must be an integer >= 0, got {self.n_sink!r}")
        params = dict(self.params)
        for name in _BOUND:  # `--param window=32` and a dict from a file set the field
            if name in params:
                object.__setattr__(self, name, params.pop(name))
        # a list parameter (from a JSON session) as a tuple, so the config stays hashable
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
        object.__setattr__(self, "params", tuple(sorted(params.items())))
        method = get_method(self.method)
        bound = {
            name: getattr(self, name) for name in _BOUND if name in {p.name for p in method.parameters()}
        }
        object.__setattr__(self, "_method", method.with_values(**bound, **params))

    def _check_layer_bits(self, allowed: tuple[int, ...], who: str) -> None:
        """Widths the scheme packs, a whole number of edge layers, not both forms; nothing when nothing is packed."""
        layer_bits = tuple(self.layer_bits)
        object.__setattr__(self, "layer_bits", layer_bits)
        for w in (*layer_bits, *((self.edge_bits,) if self.edge_layers else ())):
            if isinstance(w, bool) or not isinstance(w, int | np.integer) or w not in allowed:
                raise ValueError(f"{who}layer widths must be in {allowed}, got {w!r}")
        k = self.edge_layers
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0:
            raise ValueError(f"edge_layers must be a whole number of layers >= 0, got {k!r}")
        if layer_bits and k:
            raise ValueError("give layer_bits (a width per layer) or edge_layers with edge_bits, not both")
        if not self.quantized:  # nothing is packed, so no layer has a width
            object.__setattr__(self, "layer_bits", ())
            object.__setattr__(self, "edge_layers", 0)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompressionConfig:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "bits" in known:
            known["bits"] = bits_or_none(known["bits"])
        known["params"] = dict(known.get("params") or {})
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        """The fields, `params` as a dict and `layer_bits` as a list (what `from_dict`, the controls and JSON files
        take); the layer widths only when some layer has its own."""
        d = {**asdict(self), "params": dict(self.params), "layer_bits": list(self.layer_bits)}
        if not self.layer_bits and not self.edge_layers:  # every layer alike: the dict the controls emit
            for name in ("layer_bits", "edge_layers", "edge_bits"):
                del d[name]
        return d


@dataclass
class CompressedState:
    """A compressed copy of the prefilled cache plus what it kept and what it costs."""

    config: CompressionConfig
    cache: list[Any]
    selection: list[Any]  # per layer, as select_positions took it (None = not compressed)
    ranking: Ranking
    kept: np.ndarray  # [L, H_kv, T] bool over the schedule's compressible prompt positions
    bytes_dense: int
    bytes_compressed: int
    recompress_ms: float
    stats_rows: list[dict] = field(default_factory=list)
    quant_error: np.ndarray | None = None  # [L, H_kv, T] key/value RMSE per kept position, NaN elsewhere
    quant_rmse: list[tuple[np.ndarray, np.ndarray] | None] | None = None  # per layer: key, value RMSE [H_kv]
    #: Layers stored whole (sliding window, SSM state) -> a label such as "sliding window 32: not compressible"
    not_compressible: dict[int, str] = field(default_factory=dict)
    bytes_not_compressible: int = 0  # their steady-state bytes, the same in bytes_dense and bytes_compressed
    #: Why the method's budget rule fell back to uniform counts (pyramidkv), or None (kvcore.methods.selection.budget_note)
    budget_note: str | None = None

    @property
    def compressible_ratio(self) -> float:
        """bytes_compressed / bytes_dense over the compressible layers only (NaN when there are none)."""
        dense = self.bytes_dense - self.bytes_not_compressible
        return (self.bytes_compressed - self.bytes_not_compressible) / dense if dense else float("nan")


def not_compressible_label(layer: Any) -> str:
    """What the heatmap and the stats say about a layer KV Lens stores whole."""
    window = caches.sliding_window(layer)
    if window is not None:
        return f"sliding window {window}: not compressible"
    reason = caches.incompressible_reason(layer) or ""
    return f"{type(layer).__name__}: not compressible" + (" (SSM state)" if "SSM" in reason else "")


@dataclass
class Regeneration:
    """The compressed continuation and its metrics against the dense baseline."""

    tokens: list[int]
    metrics: dict[str, Any]
    regenerate_ms: float
    steps: metrics.StepMetrics | None = None  # per generated token: KL, agreement, both top-k


class Session:
    """Owns a model, its dense prefilled cache, observations and rankings; see the module docstring."""

    def __init__(self, model: Any, tokenizer: Any, info: loading.ModelInfo) -> None:
        self.model, self.tokenizer, self.info = model, tokenizer, info
        self._thread = threading.get_ident()
        self.forward_calls = 0
        #: Teacher-forced passes over the dense continuation (`dense_reference`: at most one per schedule and
        #: continuation): what every setting is measured against, computed once and reused (tests count it).
        self.reference_passes = 0
        self._capture: CaptureResult | None = None
        self._rankings: dict[tuple[Method, str], Ranking] = {}
        self._window_attention: dict[tuple[str, int], list[np.ndarray | None]] = {}
        self.prompt_ids: list[int] = []
        self.dense_tokens: list[int] = []
        self._dense_logits: dict[str, np.ndarray] = {}
        # Per schedule: the `_dense_logits` array and its metrics.Reference, kept while that array is current.
        self._dense_reference: dict[str, tuple[np.ndarray, metrics.Reference]] = {}
        self._dense_decode_cache: list[Any] | None = None
        self._packed: tuple[tuple[int, int, str], list[Any]] | None = None
        self.prefill_ms = 0.0
        self.chat_template_applied = False  # whether the current prompt_ids went through the chat template

    @classmethod
    def load(cls, spec: str) -> Session:
        """Load a model from a folder, the local HF cache or a repo id (ModelLoadError with the fix otherwise)."""
        model, tokenizer, info = loading.load(spec)
        return cls(model, tokenizer, info)

    # -- guards ---------------------------------------------------------------------------------------------
    def _check_thread(self) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                "Session used from another thread: MLX streams belong to the thread that loaded the model; "
                "run every session call on the engine thread"
            )

    def _require_prefill(self) -> CaptureResult:
        if self._capture is None:
            raise ValueError("no prompt has been prefilled yet: run Prefill first")
        return self._capture

    def _observed(self, schedule: str) -> CaptureResult:
        """What the schedule compresses: the whole prefill ("paper") or the prefill before the last token."""
        capture = self._require_prefill()
        return capture if schedule == "paper" else capture.before_last

    def observations(self, schedule: str = DEFAULT_SCHEDULE) -> list[Any]:
        """The prefill's per-layer LayerObservation (None where not captured) that `schedule` compresses from:
        decoding-time policies read its last queries and h2o's sums (kvcore.engine.decode_scoring)."""
        return list(self._observed(schedule).observations)

    def n_compressible(self, schedule: str = DEFAULT_SCHEDULE) -> int:
        """Compressible prompt positions T: the whole prompt ("paper") or all but its last token ("mlx-lm")."""
        if not self.prompt_ids:
            return 0
        return len(self.prompt_ids) - (0 if schedule == "paper" else 1)

    @staticmethod
    def first_compressed_step(schedule: str) -> int:
        """Index of the first generated token that can differ from the dense one (paper: the first comes from
        the dense prefill)."""
        return 1 if schedule == "paper" else 0

    # -- prefill ----------------------------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer has a chat template (then prefill applies it unless told not to)."""
        return prompting.has_chat_template(self.tokenizer)

    def encode(
        self, prompt: str | Sequence[int], chat_template: bool = True, system_prompt: str | None = None
    ) -> list[int]:
        """Prompt ids as mlx-lm makes them (kvcore.model.prompting); a list of ids is taken as it is."""
        ids, _ = self._encode(prompt, chat_template, system_prompt)
        return ids

    def _encode(
        self, prompt: str | Sequence[int], chat_template: bool, system_prompt: str | None
    ) -> tuple[list[int], bool]:
        if isinstance(prompt, str):
            ids, applied = prompting.encode_prompt(self.tokenizer, prompt, chat_template, system_prompt)
        else:
            ids, applied = [int(t) for t in prompt], False
        if len(ids) < 2:
            raise ValueError(
                f"prompt is too short ({len(ids)} token{'s' if len(ids) != 1 else ''}): type at least two tokens"
            )
        return ids, applied

    def prefill(
        self,
        prompt: str | Sequence[int],
        n_tokens: int = DEFAULT_CONTINUATION_TOKENS,
        on_progress: Progress = None,
        should_cancel: CancelCheck = None,
        chat_template: bool = True,
        system_prompt: str | None = None,
        beyond_context: bool = False,
        on_continuation: Progress = None,
        keep_interrupted: bool = False,
    ) -> dict[str, Any]:
        """Prefill with capture, then compute the dense greedy continuation of `n_tokens` (the baseline).

        A text prompt goes through the tokenizer's chat template when it has one and `chat_template` is on, as
        `mlx_lm.generate` does. Prompt plus tokens past the model's trained context are refused unless
        `beyond_context` (the positions beyond it were never trained: RoPE extrapolates; `self.beyond_context`
        then says so). `on_continuation(done, n)` follows the dense continuation. On any error (bad prompt,
        cancel) the previous prefill stays as it was; with `keep_interrupted`, a Ctrl-C once the continuation
        has a token keeps the prefill and the tokens generated until then (`extend`).
        """
        self._check_thread()
        ids, applied = self._encode(prompt, chat_template, system_prompt)
        if n_tokens < 1:
            raise ValueError(f"tokens to generate must be at least 1, got {n_tokens}")
        refusal = context_refusal(len(ids), n_tokens, self.info.max_context, beyond_context)
        if refusal is not None:
            raise ValueError(refusal)
        start = time.perf_counter()
        capture = prefill_with_capture(
            self.model,
            ids,
            window=CAPTURE_WINDOW,
            h2o=DEFAULT_H2O_CAPTURE,
            hold_last=True,
            on_progress=on_progress,
            should_cancel=should_cancel,
        )
        prefill_ms = (time.perf_counter() - start) * 1e3
        self.forward_calls += capture.forward_calls
        old = {name: getattr(self, name) for name in _PREFILL_STATE}
        self._capture, self.prompt_ids, self._rankings, self._window_attention = capture, ids, {}, {}
        self.dense_tokens, self._dense_logits, self._dense_decode_cache, self._packed = [], {}, None, None
        self.chat_template_applied = applied
        try:
            self.extend(n_tokens, should_cancel, on_continuation, keep_interrupted)
        except BaseException:
            for name, value in old.items():
                setattr(self, name, value)
            raise
        self.prefill_ms = prefill_ms
        return {
            "prompt_tokens": len(ids),
            "prefill_ms": prefill_ms,
            "skipped_layers": dict(capture.skipped),
            "chat_template": applied,
            "beyond_context": self.beyond_context,
        }

    @property
    def positions_used(self) -> int:
        """Positions the prefill and its dense continuation occupy (prompt + generated tokens)."""
        return len(self.prompt_ids) + len(self.dense_tokens)

    @property
    def beyond_context(self) -> bool:
        """Whether the dense continuation runs past the model's trained context (max_position_embeddings): only
        a prefill that opted in (`beyond_context=True`) gets there; the JSON and CSV outputs record it."""
        ctx = self.info.max_context
        return ctx is not None and self.positions_used > ctx

    def restore_prefill(
        self,
        capture: CaptureResult,
        prompt_ids: list[int],
        chat_template_applied: bool,
        dense_tokens: list[int],
        dense_logits: dict[str, np.ndarray],
        decode_cache: list[Any],
        prefill_ms: float,
    ) -> None:
        """Adopt a prefill read from a session file (kvcore.engine.session_file checked it): no forward pass."""
        self._check_thread()
        self._capture, self.prompt_ids, self._rankings, self._window_attention = capture, prompt_ids, {}, {}
        self.dense_tokens, self._dense_logits, self._dense_decode_cache = (
            dense_tokens,
            dense_logits,
            decode_cache,
        )
        self._packed, self.chat_template_applied, self.prefill_ms = None, chat_template_applied, prefill_ms

    def _mean_window_attention(self, schedule: str, window: int) -> list[np.ndarray | None]:
        """Per layer [H_kv, T]: the last `window` queries' attention, mean over queries and GQA group."""
        key = (schedule, window)
        if key in self._window_attention:
            return self._window_attention[key]
        out = []
        for obs in self._observed(schedule).observations:
            if obs is None:
                out.append(None)
                continue
            attn = window_attention(obs, min(window, obs.n_tokens)).mean(axis=1)
            out.append(attn.reshape(obs.n_kv_heads, obs.group, -1).mean(axis=1))
        mx.eval([a for a in out if a is not None])
        self._window_attention[key] = [None if a is None else np.array(a) for a in out]
        return self._window_attention[key]

    def extend(
        self,
        n: int,
        should_cancel: CancelCheck = None,
        on_progress: Progress = None,
        keep_interrupted: bool = False,
    ) -> list[int]:
        """Continue the dense greedy continuation by `n` tokens; each schedule's reference logits are computed
        again when next asked for (`dense_reference`).

        The dense continuation is the same under both schedules: its first token is the prefill's prediction at
        the last prompt position (bit-identical to mlx-lm's `generate_step`, which steps that token alone).
        `on_progress(done, n)` follows the greedy decode. `keep_interrupted`: Ctrl-C (KeyboardInterrupt) ends
        the continuation with the tokens generated until then, as a decoding policy's run does (the CLI), instead
        of leaving it as it was.
        """
        self._check_thread()
        capture = self._require_prefill()
        if n < 1:
            raise ValueError(f"tokens to generate must be at least 1, got {n}")
        if self._dense_decode_cache is None and self.dense_tokens:  # a kept Ctrl-C left no whole decode cache
            self._dense_decode_cache = self._fed(capture.cache, self.dense_tokens[:-1])
        new: list[int] = []
        try:
            if self._dense_decode_cache is None:
                cache = caches.copy_cache(capture.cache)
                new.append(int(mx.argmax(capture.logits).item()))
                step = None if on_progress is None else (lambda done, _: on_progress(done + 1, n))
                self._greedy(cache, new[0], n - 1, should_cancel, step, out=new)
            else:
                cache = caches.copy_cache(self._dense_decode_cache)
                self._greedy(cache, self.dense_tokens[-1], n, should_cancel, on_progress, out=new)
        except KeyboardInterrupt:
            if not keep_interrupted or not new:
                raise
            cache = None  # the step under way may have fed some layers only: rebuilt when next extended
        tokens = [*self.dense_tokens, *new]
        self._dense_decode_cache, self.dense_tokens, self._dense_logits = cache, tokens, {}
        return new

    def dense_reference(self, schedule: str) -> np.ndarray:
        """Logits [n, V] of the dense continuation teacher-forced under `schedule`, what every compressed state
        of that schedule is measured against: one chunked pass the first time the schedule asks, then kept
        until the continuation changes. Lazily, so a run under one schedule never pays (in time, or n × V
        float32 of memory: 268 MB at 8k tokens of the demo's vocabulary) for the other's."""
        if schedule not in self._dense_logits:
            cache = self._observed(schedule).cache
            self._dense_logits[schedule] = self._reference_logits(cache, schedule, self.dense_tokens)
            self.reference_passes += 1
        return self._dense_logits[schedule]

    # -- decoding ---------------------------------------------------------------------------------------------
    def _fed(self, cache: list[Any], tokens: Sequence[int]) -> list[Any]:
        """A copy of `cache` with `tokens` fed, REFERENCE_CHUNK at a time (as a prefill does)."""
        branch = caches.copy_cache(cache)
        for lo in range(0, len(tokens), REFERENCE_CHUNK):
            self.model(mx.array([list(tokens[lo : lo + REFERENCE_CHUNK])]), cache=branch)
            self.forward_calls += 1
        mx.eval([c.state for c in branch])
        return branch

    def _greedy(
        self,
        cache: list[Any],
        first: int,
        n: int,
        should_cancel: CancelCheck,
        on_progress: Progress = None,
        out: list[int] | None = None,
    ) -> list[int]:
        """Greedy decode of n tokens starting by feeding `first`; mutates `cache`; `on_progress(done, n)` after
        each token read back. The tokens are appended to `out` when given (what a Ctrl-C leaves is there).

        Pipelined as mlx-lm's `generate_step`: the next step is built and queued (`mx.async_eval`) before the
        current token is read back, so the host builds step i+1 while the device runs step i.
        """
        tokens: list[int] = [] if out is None else out
        start = len(tokens)

        def step(y: mx.array) -> mx.array:
            logits = self.model(y, cache=cache)
            self.forward_calls += 1
            token = mx.argmax(logits[:, -1], axis=-1, keepdims=True)
            mx.async_eval(token)
            return token

        if should_cancel is not None and should_cancel():
            raise Cancelled(f"generation cancelled after 0 of {n} tokens")
        y = step(mx.array([[first]])) if n > 0 else None
        for i in range(n):
            following = step(y) if i + 1 < n else None
            tokens.append(int(y.item()))
            if on_progress is not None:
                on_progress(i + 1, n)
            if following is not None and should_cancel is not None and should_cancel():
                raise Cancelled(f"generation cancelled after {i + 1} of {n} tokens")
            y = following
        return tokens[start:]

    def _reference_logits(
        self, cache: list[Any], schedule: str, tokens: Sequence[int], chunk: int = REFERENCE_CHUNK
    ) -> np.ndarray:
        """Logits [n, V] predicting each of `tokens` (the dense continuation) from `cache` under `schedule`.

        "mlx-lm": a teacher-forced pass feeding the last prompt token and tokens[:-1] to a copy of the cache of
        T − 1 positions. "paper": the cache holds the whole prompt, so the first row is the dense prefill's own
        prediction and the pass feeds tokens[:-1]. The feed goes in `chunk` tokens at a time into that one copy
        (as a prefill does), so attention holds chunk × (T + n) scores per query head, never n × (T + n), and
        each chunk's logits are float32 NumPy before the next runs.
        """
        capture = self._require_prefill()
        if chunk < 1:
            raise ValueError(f"reference chunk must be at least 1 token, got {chunk}")
        # rows filled in place: a list of chunks joined at the end would hold the n × V logits twice
        out = np.empty((len(tokens), capture.logits.shape[-1]), np.float32)
        if schedule == "paper":
            out[:1] = np.array(capture.logits.astype(mx.float32))
            feed = list(tokens[:-1])
        else:
            feed = [self.prompt_ids[-1], *tokens[:-1]]
        start = len(out) - len(feed)
        branch = caches.copy_cache(cache) if feed else []
        for lo in range(0, len(feed), chunk):
            logits = self.model(mx.array([feed[lo : lo + chunk]]), cache=branch)
            self.forward_calls += 1
            rows = np.array(logits[0].astype(mx.float32))
            out[start + lo : start + lo + len(rows)] = rows
        return out

    # -- compression ------------------------------------------------------------------------------------------
    def ranking(self, config: CompressionConfig) -> Ranking:
        """The method's scores and per-head priority order, computed once per (method, params)."""
        observed = self._observed(config.schedule)
        method = self.calibrated(config.method_instance.at_ratio(config.ratio))
        key = (method, config.schedule)
        if key not in self._rankings:
            self._reconstruct(method, config.schedule)
            self._rankings[key] = rank(observed.observations, method)
        return self._rankings[key]

    def calibrated(self, method: Method) -> Method:
        """`method` with its calibration artifact for this model (qfilter, expected_attention_stats); ValueError naming
        the `kvlens calibrate` command when there is none."""
        if not calibration.needs_artifact(method):
            return method
        return calibration.bind(method, calibration.model_key(self.info.path), self.info.path)

    def _reconstruct(self, method: Method, schedule: str) -> None:
        """Run the extra forward pass of a method scored by one (kvzip, a wrapper or chain over it), once per prefill,
        schedule and parameters: its scores are cached in the observations, the cache stays the context's."""
        pending = [method]
        while pending:
            method = pending.pop()
            if method.needs_reconstruction:
                ids = self.prompt_ids[: self.n_compressible(schedule)]
                observed = self._observed(schedule)
                self.forward_calls += method.reconstruct(
                    self.model, self.tokenizer, observed, ids, self.chat_template_applied
                )
            pending += [
                m for m in (getattr(method, "inner", None), *getattr(method, "stages", ())) if m is not None
            ]

    def check_config(self, config: CompressionConfig) -> None:
        """Refuse a config this model cannot run, before any work (the CLI calls it before the prefill)."""
        info = self.info
        # a calibrated method without its artifact: refused with the command that makes it
        self.calibrated(config.method_instance)
        if info.latent_rope_dim and config.method_instance.needs_query_stats:
            raise ValueError(model_checks.latent_query_stats_refusal(info.model_type, config.method))
        if not config.quantized:
            return
        refusal = model_checks.quantized_kv_refusal(
            info.model_type, info.attention_sinks, bool(info.latent_rope_dim)
        )
        if refusal is not None:
            raise ValueError(refusal)
        refusal = config.group_refusal(info.head_dim, info.value_dim)
        if refusal is not None:
            raise ValueError(refusal)

    def compress(self, config: CompressionConfig) -> CompressedState:
        """Select, gather and (optionally) quantize a compressed copy of the prefilled cache. No prefill."""
        self._check_thread()
        observed = self._observed(config.schedule)
        self.check_config(config)
        start = time.perf_counter()
        ranking = self.ranking(config)
        selection = select(ranking, config.ratio, per_head=config.per_head)
        if config.quantized and config.scheme.per_channel_keys:  # KIVI: key groups run along the kept rows
            kept_rows = caches.select_positions(observed.cache, selection, validate=False)
            cache = _by_width(
                kept_rows, config.layer_widths(len(kept_rows)), partial(kivi_cache, scheme=config.scheme)
            )
        else:
            cache = self._select_and_pack(config, ranking, selection)
        cache = config.method_instance.store(cache, self.model, observed.observations)
        recompress_ms = (time.perf_counter() - start) * 1e3
        kept = self._kept_mask(selection, self.n_compressible(config.schedule), observed.cache)
        fixed = {
            i: not_compressible_label(c)
            for i, c in enumerate(observed.cache)
            if caches.incompressible_reason(c)
        }
        state = CompressedState(
            config=config,
            cache=cache,
            selection=selection,
            ranking=ranking,
            kept=kept,
            bytes_dense=caches.cache_tensor_bytes(observed.cache),
            bytes_compressed=caches.cache_tensor_bytes(cache),
            recompress_ms=recompress_ms,
            not_compressible=fixed,
            bytes_not_compressible=caches.cache_tensor_bytes([observed.cache[i] for i in fixed]),
            budget_note=self._latent_note(ranking) or budget_note(ranking, config.ratio),
        )
        if config.quantized:
            state.quant_error, state.quant_rmse = self._quant_error(state)
        state.stats_rows = self._stats_rows(state)
        return state

    def _select_and_pack(
        self, config: CompressionConfig, ranking: Ranking, selection: list[Any]
    ) -> list[Any]:
        """The kept rows of the prefilled cache, gathered from its packed copy when quantized (rows packed each on
        their own), with the float residual when `fp_recent` asks for one."""
        observed = self._observed(config.schedule)
        source = (
            self._quantized_dense(
                config.layer_widths(len(observed.cache)), config.group_size, config.schedule, config.quant
            )
            if config.quantized
            else observed.cache
        )
        if config.quantized and config.fp_recent:
            T = self.n_compressible(config.schedule)
            return split_select(observed.cache, source, selection, T, config.n_sink, config.fp_recent)
        on_device = device_select(ranking, selection) if selects_on_device() else None
        return caches.select_positions(source, selection, validate=False, device_indices=on_device)

    def _latent_note(self, ranking: Ranking) -> str | None:
        """Why a per-head budget rule (adakv) keeps its scorer's top positions on a latent (MLA) model."""
        if not self.info.latent_rope_dim or not ranking.method.spreads_over_heads:
            return None
        return (
            f"{ranking.method.name}: {self.info.model_type}'s latent cache has one kv-head shared by all "
            f"{self.info.n_q_heads} query heads, so per-head budgets are one shared selection"
        )

    def _quantized_dense(
        self, widths: list[tuple[int, int]], group_size: int, schedule: str, quant: str = DEFAULT_QUANT
    ) -> list[Any]:
        """The whole prefilled cache packed by `quant` at each layer's (key bits, value bits) and group_size, kept for
        the last one asked for.

        mx.quantize packs each row on its own, so gathering packed rows equals packing gathered rows, bit for bit;
        packing once per bit width turns every later ratio move into a gather of packed rows, which is ~3x
        cheaper on a CPU than quantizing the kept rows again (BENCHMARKS.md, recompress). Memory: one packed
        copy (~0.28x the bf16 cache at 4 bits).
        """
        key = (tuple(widths), group_size, schedule, quant)
        if self._packed is None or self._packed[0] != key:
            self._packed = None
            source = self._observed(schedule).cache
            pack = partial(caches.quantize_cache, group_size=group_size, quant=quant)
            packed = _by_width(source, widths, pack)
            self._packed = (key, packed)
        return self._packed[1]

    def _kept_mask(self, selection: Sequence[Any], T: int, source: Sequence[Any]) -> np.ndarray:
        """[L, H_kv, T] kept prompt positions; a sliding-window layer keeps, in steady state, its last window."""
        H = self.info.n_kv_heads
        kept = np.zeros((len(selection), H, T), dtype=bool)
        for layer, sel in enumerate(selection):
            window = caches.sliding_window(source[layer])
            if sel is None and window is not None:
                kept[layer, :, max(0, T - window) :] = True
            elif sel is None:
                kept[layer] = True
            elif isinstance(sel, list):
                for h, idx in enumerate(sel):
                    kept[layer, h, idx] = True
            elif np.ndim(sel) == 1:
                kept[layer, :, sel] = True
            else:
                np.put_along_axis(kept[layer], np.asarray(sel), True, axis=1)
        return kept

    def _quant_error(self, state: CompressedState) -> tuple[np.ndarray, list]:
        """Per (layer, head, kept position): RMSE over head_dim of the dequantized key and value (mean of both)."""
        observed = self._observed(state.config.schedule)
        L, H, T = state.kept.shape
        err = np.full((L, H, T), np.nan, dtype=np.float32)
        per_layer: list[tuple[np.ndarray, np.ndarray] | None] = []
        lazy: list[list[tuple[np.ndarray, Any, Any]] | None] = []
        for dense, comp in zip(observed.cache, state.cache, strict=True):
            if isinstance(comp, ResidualKVCache):  # the float residual's rows are exact: error 0
                stores = [(comp.body, True), (comp.residual, False)]
            elif isinstance(comp, KiviKVCache):  # the body read back as float rows, the residual exact
                stores = [(comp.body_view(), True), (comp.residual, False)]
            elif isinstance(comp, caches.SparseQuantizedKVCache):
                stores = [(comp, True)]
            else:
                lazy.append(None)
                continue
            lazy.append([_row_errors(dense, store, T, packed) for store, packed in stores])
        mx.eval([x for item in lazy if item is not None for part in item for x in part[1:]])
        for layer, item in enumerate(lazy):
            if item is None:
                per_layer.append(None)
                continue
            pos = np.concatenate([p for p, _, _ in item], axis=1)
            ek = np.concatenate([np.array(e) for _, e, _ in item], axis=1)
            ev = np.concatenate([np.array(e) for _, _, e in item], axis=1)
            valid = pos >= 0
            for h in range(H):
                p = pos[h][valid[h]]
                err[layer, h, p] = 0.5 * (ek[h][valid[h]] + ev[h][valid[h]])
            per_layer.append((metrics.pooled_rmse(ek, valid), metrics.pooled_rmse(ev, valid)))
        return err, per_layer

    def _stats_rows(self, state: CompressedState) -> list[dict]:
        """One row per (layer, kv-head) with the CSV columns of kvcore.measure.export.STATS_COLUMNS."""
        cfg, T = state.config, state.kept.shape[2]
        observed = self._observed(cfg.schedule)
        window_attention = self._mean_window_attention(cfg.schedule, cfg.window)
        rows = []
        rmse = state.quant_rmse
        n_heads = state.kept.shape[1]
        setting = {("retention_ratio" if k == "ratio" else k): v for k, v in cfg.describe().items()}
        baseline = caches.element_type(observed.cache)
        widths = cfg.layer_widths(len(state.cache))
        for layer, (dense, comp) in enumerate(zip(observed.cache, state.cache, strict=True)):
            dense_head = caches.cache_tensor_bytes([dense]) // n_heads
            comp_head = caches.cache_tensor_bytes([comp]) // n_heads
            kept = [np.flatnonzero(state.kept[layer, h]) for h in range(n_heads)]
            attn = window_attention[layer]
            masses = metrics.attention_mass_kept(attn, kept) if attn is not None else np.full(n_heads, np.nan)
            for h, kept_pos in enumerate(kept):
                mass = float(masses[h])
                k_rmse = v_rmse = 0.0
                if rmse is not None and rmse[layer] is not None:
                    k_rmse, v_rmse = float(rmse[layer][0][h]), float(rmse[layer][1][h])
                rows.append(
                    {
                        **setting,
                        "group_size": cfg.group_size if cfg.quantized else "",
                        "bits_per_layer": "/".join(map(str, widths[layer])) if cfg.quantized else "",
                        "layer": layer,
                        "kv_head": h,
                        "compressible": layer not in state.not_compressible,
                        "baseline_dtype": baseline,
                        "tokens_total": T,
                        "tokens_kept": int(kept_pos.size),
                        "bytes_dense": dense_head,
                        "bytes_compressed": comp_head,
                        "attention_mass_kept": mass,
                        "key_rmse": k_rmse,
                        "value_rmse": v_rmse,
                        "budget_note": state.budget_note or "",
                    }
                )
        return rows

    def regenerate(
        self,
        state: CompressedState,
        n: int | None = None,
        should_cancel: CancelCheck = None,
        on_progress: Progress = None,
    ) -> Regeneration:
        """Teacher-forced metrics on the dense continuation and a free-running greedy continuation.

        Under "paper" the first generated token comes from the dense prefill and cannot differ, so the summary
        metrics cover tokens `first_compressed_step` … n − 1 (`compared_tokens` of them); `kl_per_step` and
        `steps` (KL, top-1 agreement and both caches' top-5 per token) have all n steps (KL 0 for the dense one).
        `on_progress(done, n)` follows the free-running continuation.
        """
        self._check_thread()
        self._require_prefill()
        schedule = state.config.schedule
        n = len(self.dense_tokens) if n is None else min(n, len(self.dense_tokens))
        start = time.perf_counter()
        tokens = self.dense_tokens[:n]
        comp_logits = self._reference_logits(state.cache, schedule, tokens)
        skip = min(self.first_compressed_step(schedule), n)
        dense = self.dense_reference(schedule)
        # The metrics (NumPy, which releases the GIL) run on a worker while the device decodes the continuation:
        # over a 128k vocabulary they cost about as much as the 32 decode steps (H200: 270 ms against 290 ms).
        with ThreadPoolExecutor(max_workers=1) as pool:
            scored = pool.submit(
                self._compare, schedule, dense, comp_logits, np.array(tokens, np.int64), skip
            )
            free = self.continuation(state, n, should_cancel, on_progress)
            m, steps = scored.result()
        m["kl_per_step"] = steps.kl.tolist()  # the dense first step of "paper" compares equal logits: KL 0
        m["first_divergence"] = metrics.first_divergence(tokens, free)
        regenerate_ms = (time.perf_counter() - start) * 1e3
        m.update(
            schedule=schedule,
            first_compressed_step=skip,
            compared_tokens=n - skip,
            bytes_dense=state.bytes_dense,
            bytes_compressed=state.bytes_compressed,
            bytes_not_compressible=state.bytes_not_compressible,
            compressible_ratio=state.compressible_ratio,
            compression_ratio=state.bytes_compressed / state.bytes_dense
            if state.bytes_dense
            else float("nan"),
            recompress_ms=state.recompress_ms,
            regenerate_ms=regenerate_ms,
        )
        return Regeneration(free, m, regenerate_ms, steps)

    def _compare(
        self, schedule: str, dense: np.ndarray, comp_logits: np.ndarray, targets: np.ndarray, skip: int
    ) -> tuple[dict, metrics.StepMetrics]:
        """metrics.compare against the dense side, whose log-softmax and top-k are kept per reference array."""
        cached = self._dense_reference.get(schedule)
        if cached is None or cached[0] is not dense:
            cached = (dense, metrics.reference(dense))
            self._dense_reference[schedule] = cached
        return metrics.compare(cached[1], comp_logits, targets, skip)

    def continuation(
        self, state: CompressedState, n: int, should_cancel: CancelCheck = None, on_progress: Progress = None
    ) -> list[int]:
        """The free-running greedy continuation of n tokens from a compressed state (the state is not changed).

        Under "paper" the first token is the dense prefill's (the papers take it from there); under "mlx-lm" the
        last prompt token is fed through the compressed cache first.
        """
        self._check_thread()
        self._require_prefill()
        if n <= 0:
            return []
        branch = caches.copy_cache(state.cache)
        if state.config.schedule == "paper":
            first = self.dense_tokens[0]
            step = None if on_progress is None else (lambda done, _: on_progress(done + 1, n))
            return [first, *self._greedy(branch, first, n - 1, should_cancel, step)]
        return self._greedy(branch, self.prompt_ids[-1], n, should_cancel, on_progress)

    def answer(
        self,
        state: CompressedState,
        question: Question,
        n: int,
        suffix: str = "",
        should_cancel: CancelCheck = None,
    ) -> Answer:
        """Query-agnostic: `question` appended to copies of the dense and the compressed cache of the prefilled
        context (neither changes), each answered greedily for n tokens (kvcore.engine.questions). `suffix` follows
        the question's text (the chat template's end of the user message, kvcore.model.prompting.split_chat);
        `Cancelled` between decode steps when `should_cancel()` says so."""
        schedule = state.config.schedule
        feed = self._question_feed(question.text + suffix, question.text, n, schedule)
        dense_cache = self._observed(schedule).cache
        dense_tokens = self._answer_tokens(dense_cache, feed, n, should_cancel)
        comp_tokens = self._answer_tokens(state.cache, feed, n, should_cancel)
        forced = [*feed, *dense_tokens[:-1]]
        dense_logits = self._logits_after(dense_cache, forced, n)
        comp_logits = self._logits_after(state.cache, forced, n)
        scores = metrics.teacher_forced(dense_logits, comp_logits, np.array(dense_tokens, np.int64))
        decode = self.tokenizer.decode
        return Answer(question, decode(dense_tokens), decode(comp_tokens), dense_tokens, comp_tokens, scores)

    def answer_tokens(self, state: CompressedState | None, text: str, n: int, schedule: str) -> list[int]:
        """The greedy answer alone (no metrics): `text` appended to a copy of the compressed cache, or of the dense
        one when `state` is None; what a benchmark that only scores answers needs (kvcore.probes.ruler)."""
        feed = self._question_feed(text, text, n, schedule)
        cache = self._observed(schedule).cache if state is None else state.cache
        return self._answer_tokens(cache, feed, n)

    def _question_feed(self, text: str, shown: str, n: int, schedule: str) -> list[int]:
        """The tokens a question feeds after the context; ValueError when empty or beyond the model's context."""
        self._check_thread()
        self._require_prefill()
        if n < 1:
            raise ValueError(f"tokens to generate must be at least 1, got {n}")
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids or not shown.strip():
            raise ValueError(f"question {shown!r} is empty: give it some text")
        ctx = self.info.max_context
        total = len(self.prompt_ids) + len(ids) + n
        if ctx is not None and total > ctx:
            raise ValueError(
                f"context ({len(self.prompt_ids)} tokens), question ({len(ids)}) and answer ({n}) need {total} "
                f"positions, but the model's context is {ctx} (max_position_embeddings): shorten the context or the answer (going past the trained context, "
                "--beyond-context or the window's box, does not apply to questions)"
            )
        # Under mlx-lm the caches stop one token short of the context: its last token goes in with the question.
        return [*([] if schedule == "paper" else [self.prompt_ids[-1]]), *ids]

    def _answer_tokens(
        self, cache: list[Any], feed: Sequence[int], n: int, should_cancel: CancelCheck = None
    ) -> list[int]:
        branch = caches.copy_cache(cache)
        if len(feed) > 1:
            self.model(mx.array([list(feed[:-1])]), cache=branch)
            self.forward_calls += 1
        return self._greedy(branch, feed[-1], n, should_cancel)

    def _logits_after(self, cache: list[Any], tokens: Sequence[int], n: int) -> np.ndarray:
        """The last n rows of logits [n, V] of `tokens` fed through a copy of `cache` (float32)."""
        logits = self.model(mx.array([list(tokens)]), cache=caches.copy_cache(cache))
        self.forward_calls += 1
        return np.array(logits[0, -n:].astype(mx.float32))

    # -- conveniences ---------------------------------------------------------------------------------------
    def token_texts(self, ids: Sequence[int]) -> list[str]:
        """Each token's own text (decoded alone), for axes and hover."""
        return [self.tokenizer.decode([int(t)]) for t in ids]

    @staticmethod
    def kept_channels(state: CompressedState) -> list[np.ndarray | None]:
        """Per layer [H_kv, d_kept]: the key channels each kv-head stores (think), or None where all are stored."""
        return [None if getattr(c, "channels", None) is None else np.array(c.channels) for c in state.cache]

    @staticmethod
    def merge_targets(state: CompressedState) -> list[np.ndarray | None]:
        """Per layer [H_kv, T]: the kept position each evicted one was merged into (merging), −1 where a position
        is kept or was not merged; None for a layer nothing was merged in."""
        return [getattr(c, "merged_into", None) for c in state.cache]

    def kept_positions(self, state: CompressedState) -> list[list[list[int]]]:
        """[layer][kv_head] -> kept logical prompt positions, for the --positions JSON."""
        return [
            [np.flatnonzero(state.kept[layer, h]).tolist() for h in range(state.kept.shape[1])]
            for layer in range(state.kept.shape[0])
        ]


def _row_errors(dense: Any, store: Any, n_prompt: int, packed: bool) -> tuple[np.ndarray, Any, Any]:
    """(positions [H, n_rows] with -1 for padding, key RMSE, value RMSE per stored row) of one store of a layer;
    a float store (the residual) holds the dense rows themselves, so its errors are zeros."""
    pos = _positions_matrix(store, n_prompt)
    if not packed or pos.shape[1] == 0:  # a float store, or a packed one the residual left empty
        zeros = np.zeros(pos.shape, dtype=np.float32)
        return pos, zeros, zeros
    dk, dv = dense.keys[0, :, : dense.offset], dense.values[0, :, : dense.offset]
    qk, qv = store.keys_and_values()
    deq_k = caches.dequantized(qk, store.group_size, store.bits, store.quant)[0].astype(mx.float32)
    deq_v = caches.dequantized(qv, store.group_size, store.value_bits, store.quant)[0].astype(mx.float32)
    safe = mx.array(np.maximum(pos, 0))
    ref_k = mx.take_along_axis(dk.astype(mx.float32), safe[..., None], axis=1)
    ref_v = mx.take_along_axis(dv.astype(mx.float32), safe[..., None], axis=1)
    ek = mx.sqrt(mx.mean((ref_k - deq_k) ** 2, axis=-1))
    ev = mx.sqrt(mx.mean((ref_v - deq_v) ** 2, axis=-1))
    return pos, ek, ev


def _positions_matrix(layer: Any, n_prompt: int) -> np.ndarray:
    """[H_kv, n_rows] logical position of each stored row of a sparse layer, -1 where a row is padding."""
    pos = layer.retained_positions
    width = layer.n_kept
    out = np.full((len(pos), width), -1, dtype=np.int64)
    for h, p in enumerate(pos):
        p = np.asarray(p)
        p = p[p < n_prompt]
        out[h, : p.size] = p
    return out


def _by_width(
    cache: Sequence[Any], widths: Sequence[tuple[int, int]], pack: Callable[..., list[Any]]
) -> list[Any]:
    """Each layer packed by `pack(layers, bits=, value_bits=)` at its own (key, value) widths: one call per distinct
    pair, the other layers given as None (which every packer passes through)."""
    out: list[Any] = list(cache)
    for kb, vb in dict.fromkeys(widths):
        chosen = [c if w == (kb, vb) else None for c, w in zip(cache, widths, strict=True)]
        packed = pack(chosen, bits=kb, value_bits=vb)
        for i, w in enumerate(widths):
            if w == (kb, vb):
                out[i] = packed[i]
    return out
