"""The one small protocol every compression method follows (kvpress's ScorerPress, reduced to what KV Lens needs).

A method is a frozen dataclass: its fields are its hyper-parameters, each declared with `param` (the literature's
default, a one-line help, its limits), so the GUI's widgets, the CLI's `--param NAME=VALUE`, session files and CSV
columns all read the declaration instead of a list kept elsewhere. It turns one layer's `LayerObservation` into
scores [H_kv, T] (higher = keep) and names the positions it always keeps, in priority order. Ranking and budgets are
shared (`kvcore.methods.selection`, `kvcore.methods.budgets`), so a method is only its scores: that is what the
heatmap shows and what the tests check against NumPy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import Parameter, declared_parameters, param
from kvcore.defaults import CAPTURE_WINDOW, DEFAULT_N_SINK, DEFAULT_WINDOW


@dataclass(frozen=True)
class Method:
    """Base scorer. Subclasses set `name`, `description` and `paper`, declare fields with `param` and implement
    `scores`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: Where the method is defined: "Title (Authors Year), arXiv:ID" (or a DOI / URL); "none: …" says why there is
    #: no paper (a baseline, a kvpress utility). The method chooser's tooltip and `kvlens methods` show it.
    paper: ClassVar[str] = ""
    budget: ClassVar[str] = (
        "uniform"  # or "pyramidkv": per-layer counts from kvcore.methods.budgets; or "global"
    )
    # (kvzip): the lowest scores across all layers and heads evicted (kvcore.methods.selection.global_select)
    shared_across_heads: ClassVar[bool] = False  # every kv-head keeps the same positions (tova)
    keeps_everything: ClassVar[bool] = False  # full: the ratio does not apply
    spreads_over_heads: ClassVar[bool] = False  # adakv: a layer's budget is spread unevenly over its kv-heads
    needs_h2o: ClassVar[bool] = False  # h2o's column sums from every prompt query (capture h2o=True)
    needs_query_stats: ClassVar[bool] = (
        False  # pre-RoPE query statistics (kvcore.capture.query_stats): not on MLA
    )
    #: Scores come from an extra forward pass over the context (kvzip): Session runs `reconstruct` before ranking.
    needs_reconstruction: ClassVar[bool] = False
    #: A wrapper takes another method (`inner`) and is named WRAPPER-INNER (adakv-h2o); bare, it wraps `default_inner`.
    wraps: ClassVar[bool] = False
    default_inner: ClassVar[str] = ""
    #: The scores read only the keys and values given (knorm, keydiff, lagkv): a wrapper may score any subset of
    #: positions (chunk, block, composed), as kvpress does. Query-based scorers saw only the prompt's last queries.
    scores_from_cache: ClassVar[bool] = False
    #: The method picks its kept positions itself per ratio (`choose`), not as the top n of its ranking.
    chooses: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for p in self.own_parameters():
            value = getattr(self, p.name)
            if p.kind is tuple and isinstance(value, list):  # from a JSON session or CSV: hashable again
                object.__setattr__(self, p.name, tuple(value))
            p.check(self.name, getattr(self, p.name))

    @classmethod
    def own_parameters(cls) -> tuple[Parameter, ...]:
        """The hyper-parameters this class declares (a wrapper's, without its inner method's)."""
        return declared_parameters(cls)

    def parameters(self) -> tuple[Parameter, ...]:
        """Every hyper-parameter this method reads (a wrapper's and its inner method's)."""
        return self.own_parameters()

    def values(self) -> dict[str, int | float]:
        """Each parameter's current value by name."""
        return {p.name: getattr(self, p.name) for p in self.own_parameters()}

    def with_values(self, **values: int | float) -> Method:
        """A copy with these parameters set (checked as on creation)."""
        self.check_names(values)
        return dataclasses.replace(self, **values)

    def check_names(self, values: dict[str, Any]) -> None:
        """ValueError naming the parameters this method has when `values` names one it has not."""
        unknown = sorted(set(values) - {p.name for p in self.parameters()})
        if unknown:
            have = ", ".join(p.name for p in self.parameters()) or "none"
            raise ValueError(f"{self.label} has no parameter {', '.join(unknown)} (its parameters: {have})")

    @property
    def label(self) -> str:
        """The name `kvcore.methods.get` takes for this method."""
        return self.name

    @classmethod
    def refusal(cls, inner: type[Method]) -> str | None:
        """Why this wrapper cannot wrap methods of class `inner` (one line naming the fix), or None when it can."""
        # a method that decides across layers (duo_attention's streaming heads) has no per-layer ranking to wrap
        decides_across = inner.across_layers is not Method.across_layers
        if (
            inner.wraps
            or inner.keeps_everything
            or inner.shared_across_heads
            or inner.chooses
            or decides_across
        ):
            return f"{cls.name} needs a per-head scorer, got {inner.name!r}: wrap snapkv, knorm, h2o..."
        if inner.budget == "global":
            return (
                f"{cls.name} cannot wrap {inner.name!r}: it evicts across layers and heads; "
                f"use {inner.name} alone, or think-{inner.name} / merging-{inner.name}"
            )
        return None

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        """Scores [H_kv, T], float32, higher = more worth keeping."""
        raise NotImplementedError

    def reconstruct(self, model: Any, tokenizer: Any, capture: Any, ids: list[int], templated: bool) -> int:
        """needs_reconstruction methods: run their forward pass over `capture` and cache the scores in its
        observations; returns the forward calls made."""
        return 0

    def store(self, cache: list[Any], model: Any, observations: Any = ()) -> list[Any]:
        """The compressed cache as this method stores it (key_rerotation re-rotates the kept keys, think narrows
        them, merging folds evicted values in); by default the kept rows as they were. `observations`: the
        schedule's, per layer."""
        return cache

    def always_kept(self, n_tokens: int) -> np.ndarray:
        """Positions ranked above every scored one, highest priority first (kept as far as the budget allows)."""
        return np.zeros(0, np.int64)

    def across_layers(self, scores: list[np.ndarray | None], ratio: float) -> list[Any] | None:
        """Every layer's kept positions at once, for a method that decides across layers from all layers' scores
        [H_kv, T] (duo_attention's streaming heads); None (the default): each layer is ranked and sliced alone."""
        return None

    def at_ratio(self, ratio: float) -> Method:
        """The method as it scores when keeping `ratio` of the prompt: itself, but for a method whose default
        follows kvpress's compression ratio 1 − r (compactor's blending)."""
        return self

    def auxiliary(self, obs: LayerObservation, layer: int) -> mx.array | None:
        """A second per-layer array `choose` reads (criticalkv's ‖W_o·v‖₁), computed once with the scores."""
        return None

    def counts(self, n_tokens: int, ratio: float, n_layers: int) -> list[int] | None:
        """Per-layer budgets when the method sets its own (per_layer_compression); None: the shared rules."""
        return None

    def final_scores(self, pick: Pick) -> np.ndarray | None:
        """[H_kv, T]: what a `chooses` method finally ranks positions by at this ratio (chunkkv's chunk means), for
        the heatmap's Score view; None when its own scores tell it."""
        return None

    def choose(self, pick: Pick) -> np.ndarray | list[np.ndarray]:
        """Kept positions of one layer (`chooses` methods): [H_kv, n] or [n] sorted, or H_kv ragged arrays."""
        raise NotImplementedError


@dataclass(frozen=True)
class Pick:
    """What a `chooses` method picks one layer's kept positions from."""

    obs: LayerObservation
    scores: np.ndarray  # [H_kv, T] the method's scores
    order: np.ndarray  # [H_kv, T] positions by priority (always-kept first)
    auxiliary: np.ndarray | None
    n: int  # the layer's budget per kv-head
    ratio: float
    layer: int
    score_range: tuple[float, float]  # lowest and highest score over every ranked layer
    n_layers: int = 0  # layers in the model (lukv's curve holds one row per layer)
    #: every layer's scores (None where not captured), one tuple per `select` call: global budgets (kvcompose)
    all_scores: tuple[np.ndarray | None, ...] = ()


def window_param() -> Any:
    """The observation window (snapkv and the methods built on it): capture keeps up to CAPTURE_WINDOW queries."""
    return param(
        DEFAULT_WINDOW,
        "observation window: the last prompt queries that vote",
        minimum=1,
        maximum=CAPTURE_WINDOW,
    )


def n_sink_param(maximum: int | None = None) -> Any:
    """Attention sinks (Xiao et al. 2023): the first positions, always kept."""
    return param(
        DEFAULT_N_SINK, "attention sinks: the first positions, always kept", minimum=0, maximum=maximum
    )


def effective_window(obs: LayerObservation, window: int) -> int:
    """The window actually used: `window`, or fewer when the prompt is shorter; never more than captured."""
    captured = obs.window_queries.shape[1]
    w = min(window, obs.n_tokens)
    if w > captured:
        raise ValueError(
            f"window {window} needs {w} captured queries but prefill kept {captured}: capture with window >= {window}"
        )
    return w


def window_attention(obs: LayerObservation, w: int) -> mx.array:
    """Causal softmax attention [H_q, w, T] of the last `w` prompt queries over all prompt keys (float32)."""
    n_tokens, group = obs.n_tokens, obs.group
    q = obs.window_queries[:, -w:].astype(mx.float32) * obs.scale  # [H_q, w, D]
    k = obs.keys.astype(mx.float32)  # [H_kv, T, D]
    q = q.reshape(obs.n_kv_heads, group, w, -1)
    logits = q @ k.transpose(0, 2, 1)[:, None]  # [H_kv, group, w, T]
    query_pos = mx.arange(n_tokens - w, n_tokens)[:, None]
    logits = mx.where(mx.arange(n_tokens)[None, :] <= query_pos, logits, -mx.inf)
    return mx.softmax(logits, axis=-1, precise=True).reshape(obs.n_q_heads, w, n_tokens)


def group_mean(per_query_head: mx.array, n_kv_heads: int) -> mx.array:
    """[H_q, T] -> [H_kv, T]: mean over each GQA group (query head h reads kv-head h // group)."""
    n_q_heads, n_tokens = per_query_head.shape
    return per_query_head.reshape(n_kv_heads, n_q_heads // n_kv_heads, n_tokens).mean(axis=1)
