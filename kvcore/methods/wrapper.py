"""What every wrapper shares: an inner method whose scores, parameters and needs it passes on.

A wrapper (`wraps = True`) is named WRAPPER-INNER (`chunkkv-snapkv`); bare, it wraps its `default_inner`. Its own
parameters come after the inner method's; `with_values` sends each name to whichever declares it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.capture.prefill import LayerObservation
from kvcore.declared import Parameter
from kvcore.methods.base import Method


def _no_inner() -> Any:
    return None


@dataclass(frozen=True)
class Wrapper(Method):
    wraps = True

    inner: Method = dataclasses.field(default_factory=_no_inner)

    def __post_init__(self) -> None:
        if self.inner is None:
            raise ValueError(f"{self.name} wraps a method: build it with kvcore.methods.get({self.name!r})")
        why = self.refusal(type(self.inner))
        if why is not None:
            raise ValueError(why)
        super().__post_init__()

    @property
    def label(self) -> str:
        return f"{self.name}-{self.inner.label}"

    @property
    def budget(self) -> str:  # type: ignore[override]
        return self.inner.budget

    @property
    def needs_h2o(self) -> bool:  # type: ignore[override]
        return self.inner.needs_h2o

    @property
    def needs_query_stats(self) -> bool:  # type: ignore[override]
        return self.inner.needs_query_stats

    @property
    def spreads_over_heads(self) -> bool:  # type: ignore[override]
        return self.inner.spreads_over_heads

    def parameters(self) -> tuple[Parameter, ...]:
        return (*self.inner.parameters(), *self.own_parameters())

    def values(self) -> dict[str, Any]:
        return {**self.inner.values(), **super().values()}

    def with_values(self, **values: Any) -> Method:
        self.check_names(values)
        own = {p.name for p in self.own_parameters()}
        theirs = {k: v for k, v in values.items() if k not in own}
        inner = self.inner.with_values(**theirs) if theirs else self.inner
        return dataclasses.replace(self, inner=inner, **{k: v for k, v in values.items() if k in own})

    def scores(self, obs: LayerObservation, layer: int) -> mx.array:
        return self.inner.scores(obs, layer)

    def always_kept(self, n_tokens: int) -> np.ndarray:
        return self.inner.always_kept(n_tokens)


def subset(obs: LayerObservation, positions: np.ndarray) -> LayerObservation:
    """The observation restricted to `positions` ([n] shared or [H_kv, n] per head) of its keys and values, as
    kvpress hands a wrapped press a slice of the cache. Only `scores_from_cache` methods may score it."""
    index = mx.array(np.asarray(positions, np.int32))
    if index.ndim == 1:
        index = mx.broadcast_to(index[None], (obs.n_kv_heads, index.shape[0]))

    def take(rows: mx.array | None) -> mx.array | None:
        return None if rows is None else mx.take_along_axis(rows, index[..., None], axis=1)

    return dataclasses.replace(
        obs,
        keys=take(obs.keys),
        values=take(obs.values),
        window_queries=obs.window_queries[:, :0],
        h2o_sums=None,
        pending_queries=None,
        query_stats=None,
    )


def store_refusal(name: str, inner: type[Method]) -> str | None:
    """Refusal for wrappers that change only what is stored (think, merging): any per-head scorer, kvzip's global
    eviction included, keeps its selection."""
    if inner.wraps or inner.keeps_everything or inner.shared_across_heads or inner.chooses:
        return f"{name} needs a per-head scorer, got {inner.name!r}: use {name}-snapkv, {name}-knorm…"
    return None


def cache_scorer_refusal(name: str, inner: type[Method]) -> str | None:
    """Refusal for wrappers that score slices of the cache: the inner method must read only keys and values."""
    if inner.wraps or inner.keeps_everything or inner.chooses or not inner.scores_from_cache:
        return (
            f"{name} scores slices of the cache, so it needs a scorer of keys and values alone, got {inner.name!r} "
            f"(queries are captured for the prompt's last window only): use {name}-knorm or {name}-keydiff"
        )
    return None


def padded_scores(pick_scores: np.ndarray, always: np.ndarray) -> np.ndarray:
    """The scores as kvpress's scorers hand them to a wrapper: positions a method always keeps (snapkv's window)
    score the layer's highest other score + 1, so sums and products over them rank as kvpress's do."""
    out = pick_scores.astype(np.float32, copy=True)
    if always.size:
        rest = np.delete(out, always, axis=1)
        out[:, always] = (rest.max() if rest.size else 0.0) + 1
    return out
