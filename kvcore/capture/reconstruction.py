"""Extra forward passes over a prefilled context, for the methods that score by what the model does next (kvzip).

KVzip (Kim et al. 2025) scores each cached pair by the attention it receives while the model, after the context,
reads a "repeat the context" prompt and the context again. `replay` runs such inputs one at a time through a
copy of the context's cache that shares its rows (the originals are never written: mlx-lm's `KVCache` reallocates
when a copy at its full length grows), so every input sees exactly the context, as kvpress's hook restores it
after each layer. An observer sees each layer's attention call; `input_norms` also gives it the L2 norm of each
row entering the layer's attention (KVzip+'s normalisation). The appended rows are dropped with the copy. A long
input may go through in `step`s (its later steps see the earlier ones in the copy, as a chunked prefill does): the
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


@contextmanager
def _tapped(model: nn.Module, norms: dict[int, mx.array]) -> Iterator[int]:
    """Wrap every `self_attn` child in `_InputNorm`; yields how many were wrapped; restores them on exit."""
    wrapped = [
        (m, m["self_attn"])
        for m in model.modules()
        if isinstance(m, nn.Module) and isinstance(m.get("self_attn"), nn.Module)
    ]
    try:
        for module, attn in wrapped:
            module.self_attn = _InputNorm(attn, norms)
        yield len(wrapped)
    finally:
        for module, attn in wrapped:
            module.self_attn = attn


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

    def seen(queries, keys, values, layer_cache, scale, mask, latent=False) -> None:
        layer = layer_of.get(id(layer_cache))
        if layer is None:
            return
        if latent:
            raise ValueError("this method replays the context through full-rank attention: not on MLA layers")
        made.extend(observer(layer, queries, keys, values, float(scale), norms.get(id(layer_cache))))

    tapping = _tapped(model, norms) if input_norms else _no_tap()
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
