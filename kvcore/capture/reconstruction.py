"""Extra forward passes over a prefilled context, for the methods that score by what the model does next (kvzip).

KVzip (Kim et al. 2025) scores each cached pair by the attention it receives while the model, after the context,
reads a "repeat the context" prompt and the context again. `replay` runs such inputs one at a time through a
copy of the context's cache that shares its rows (the originals are never written: mlx-lm's `KVCache` reallocates
when a copy at its full length grows), so every input sees exactly the context, as kvpress's hook restores it
after each layer. An observer sees each layer's attention call; `input_norms` also gives it the L2 norm of each
row entering the layer's attention (KVzip+'s normalisation). The appended rows are dropped with the copy.

KVgrad (kvpress's KVgradPress) also needs how much the replay's last hidden states depend on each layer's
attention output: `replay_gradients` runs the same replay under `mx.value_and_grad`, differentiating
Φ = Σ_p ‖h_p‖² (h: the last layer's output, before the final norm) with respect to a zero shift added to every
attention output — the gradient there is ∂Φ/∂(attention output). Parameters and the context's rows are constants.

A long input may go through in `step`s (its later steps see the earlier ones in the copy, as a chunked prefill does): the
observer is then called once per step and layer, with that step's queries, the last of the keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache

from kvcore.cache import sparse as caches
from kvcore.model import attention

#: observer(layer, queries [1, H_q, N, D], keys [1, H_kv, T + N, D], values, scale, input_norms [N] or None)
#: -> the arrays it made, evaluated after the pass (nothing else of the pass is: the LM head never runs).
ReplayObserver = Callable[[int, mx.array, mx.array, mx.array, float, mx.array | None], list[mx.array]]


class _InputNorm(nn.Module):
    """Wraps one attention module during a replay: same output; the norm of each input row kept by its cache."""

    def __init__(self, inner: nn.Module, norms: dict[int, mx.array]) -> None:
        super().__init__()
        self.inner = inner
        self._norms = norms

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
        self._norms[id(cache)] = mx.linalg.norm(x[0].astype(mx.float32), axis=-1)
        return self.inner(x, *args, **kwargs)


class _ShiftedOutput(nn.Module):
    """Wraps one attention module during a gradient replay: its output plus the shift of its layer (zeros), so the
    gradient with respect to the shift is the gradient with respect to the attention output."""

    def __init__(self, inner: nn.Module, shifts: dict[int, mx.array], layer_of: dict[int, int]) -> None:
        super().__init__()
        self.inner = inner
        self._shifts = shifts
        self._layer_of = layer_of

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        cache = kwargs.get("cache", args[1] if len(args) > 1 else None)
        out = self.inner(x, *args, **kwargs)
        layer = self._layer_of.get(id(cache))
        return out if layer is None else out + self._shifts[layer].astype(out.dtype)


class _LastOutput(nn.Module):
    """Wraps the last decoder layer during a gradient replay: same output, kept for the objective; its attributes
    are the layer's (models read flags such as `use_sliding` from their layers)."""

    def __init__(self, inner: nn.Module, kept: dict[str, mx.array]) -> None:
        super().__init__()
        self.inner = inner
        self._kept = kept

    def __getattr__(self, key: str) -> Any:
        try:
            return super().__getattr__(key)
        except AttributeError:
            if "inner" not in self:
                raise
            return getattr(self["inner"], key)

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        out = self.inner(*args, **kwargs)
        self._kept["hidden"] = out
        return out


@contextmanager
def _tapped(model: nn.Module, wrap: Callable[[nn.Module], nn.Module]) -> Iterator[int]:
    """Replace every `self_attn` child by `wrap(it)`; yields how many were wrapped; restores them on exit."""
    wrapped = [
        (m, m["self_attn"])
        for m in model.modules()
        if isinstance(m, nn.Module) and isinstance(m.get("self_attn"), nn.Module)
    ]
    try:
        for module, attn in wrapped:
            module.self_attn = wrap(attn)
        yield len(wrapped)
    finally:
        for module, attn in wrapped:
            module.self_attn = attn


@contextmanager
def _last_layer_kept(model: nn.Module, kept: dict[str, mx.array]) -> Iterator[None]:
    """Wrap the model's last decoder layer (`model.layers[-1]`) in `_LastOutput`; restores it on exit."""
    layers = getattr(model, "layers", None)
    if not layers:
        raise ValueError(
            "kvgrad differentiates the last decoder layer's output, but this model lists no `layers`: use kvzip"
        )
    last = layers[-1]
    layers[-1] = _LastOutput(last, kept)
    try:
        yield
    finally:
        layers[-1] = last


def _context_copy(cache: Sequence[Any]) -> list[Any]:
    """The cache for one replay: plain layers as new KVCaches over the same rows, the others copied."""
    out = []
    for layer in cache:
        if type(layer) is KVCache and layer.keys is not None:
            copy = KVCache()
            n = layer.offset
            copy.keys, copy.values, copy.offset = layer.keys[..., :n, :], layer.values[..., :n, :], n
            out.append(copy)
        else:
            out.append(caches.copy_cache([layer])[0])
    return out


def replay(
    model: nn.Module,
    cache: Sequence[Any],
    ids: Sequence[int],
    observer: ReplayObserver,
    input_norms: bool = False,
    step: int | None = None,
) -> None:
    """Run `ids` after the context held by `cache`, calling `observer` at every plain layer's attention, then
    evaluate what it made. `cache` is left as it was. input_norms=True passes each layer's input row norms
    (ValueError when the model has no `self_attn` modules to read them from). `step`: at most this many ids per
    forward call (None: all at once); what the observer made is evaluated after each."""
    attention.install(model)
    norms: dict[int, mx.array] = {}
    copy = _context_copy(cache)
    layer_of = {id(c): i for i, c in enumerate(copy) if type(c) is KVCache}
    made: list[mx.array] = []

    def record(layer, queries, keys, values, scale, layer_cache) -> None:
        made.extend(observer(layer, queries, keys, values, scale, norms.get(id(layer_cache))))

    seen = _plain_layers(layer_of, record)
    tapping = _tapped(model, lambda attn: _InputNorm(attn, norms)) if input_norms else _no_tap()
    with tapping as n_tapped, attention.observing(seen):
        if input_norms and not n_tapped:
            raise ValueError(
                "this model has no self_attn modules: KVzip+ normalisation cannot read their input"
            )
        ids = list(ids)
        size = step or max(1, len(ids))
        for start in range(0, len(ids), size):
            model(mx.array([ids[start : start + size]]), cache=copy)
            mx.eval(made)


@contextmanager
def _no_tap() -> Iterator[int]:
    yield 0


def _plain_layers(layer_of: dict[int, int], record: Callable[..., None]) -> attention.Observer:
    """An attention observer passing `record(layer, queries, keys, values, scale, layer_cache)` the calls of the
    replay's plain layers (`layer_of`: cache id -> layer); a latent (MLA) layer is refused."""

    def seen(queries, keys, values, layer_cache, scale, mask, latent=False) -> None:
        layer = layer_of.get(id(layer_cache))
        if layer is None:
            return
        if latent:
            raise ValueError("this method replays the context through full-rank attention: not on MLA layers")
        record(layer, queries, keys, values, float(scale), layer_cache)

    return seen


#: observer(layer, queries [1, H_q, N, D], keys [1, H_kv, T + N, D], values, scale, gradient norms [N]) -> the
#: arrays it made; queries, keys and values carry no gradient.
GradientObserver = Callable[[int, mx.array, mx.array, mx.array, float, mx.array], list[mx.array]]


def replay_gradients(
    model: nn.Module, cache: Sequence[Any], ids: Sequence[int], observer: GradientObserver
) -> None:
    """Run `ids` after the context held by `cache` as `replay` does, differentiate Φ = Σ_p ‖h_p‖² (float32; h the
    last decoder layer's output over the N inputs) with respect to every plain layer's attention output, and call
    `observer` per layer with that layer's attention inputs and ‖∂Φ/∂(attention output)_p‖₂ for each input p;
    then evaluate what it made. `cache` is left as it was."""
    attention.install(model)
    layer_of_cache: dict[int, int] = {}
    calls: dict[int, tuple[mx.array, mx.array, mx.array, float]] = {}
    shifts: dict[int, mx.array] = {}
    kept: dict[str, mx.array] = {}
    layers = [i for i, c in enumerate(cache) if type(c) is KVCache and c.keys is not None]
    width = _hidden_width(model)

    def record(layer, queries, keys, values, scale, layer_cache) -> None:
        calls[layer] = (mx.stop_gradient(queries), mx.stop_gradient(keys), mx.stop_gradient(values), scale)

    seen = _plain_layers(layer_of_cache, record)

    def objective(zeros: list[mx.array]) -> mx.array:
        copy = _context_copy(cache)
        layer_of_cache.clear()
        layer_of_cache.update({id(copy[i]): i for i in layers})
        shifts.clear()
        shifts.update(zip(layers, zeros, strict=True))
        model(mx.array([list(ids)]), cache=copy)
        hidden = kept["hidden"].astype(mx.float32)
        return (hidden * hidden).sum()

    zeros = [mx.zeros((1, len(ids), width), mx.float32) for _ in layers]
    shifting = _tapped(model, lambda attn: _ShiftedOutput(attn, shifts, layer_of_cache))
    with shifting, _last_layer_kept(model, kept), attention.observing(seen):
        _, grads = mx.value_and_grad(objective)(zeros)
    made: list[mx.array] = []
    for layer, grad in zip(layers, grads, strict=True):
        if layer not in calls:
            raise ValueError(f"layer {layer}'s attention was not seen by the gradient replay")
        norms = mx.linalg.norm(grad[0].astype(mx.float32), axis=-1)
        made.extend(observer(layer, *calls[layer], norms))
    mx.eval(made)


def _hidden_width(model: nn.Module) -> int:
    """The residual stream's width: the rows of the first attention's o_proj weight (packed or not)."""
    for m in model.modules():
        attn = m.get("self_attn") if isinstance(m, nn.Module) else None
        o_proj = attn.get("o_proj") if isinstance(attn, nn.Module) else None
        if isinstance(o_proj, nn.Module) and "weight" in o_proj:
            return int(o_proj["weight"].shape[0])
    raise ValueError("kvgrad reads W_o, but this model's attention modules have no o_proj weight: use kvzip")
