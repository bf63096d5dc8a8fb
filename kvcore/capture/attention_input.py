"""The rows entering each layer's attention (after its input norm): what kvzap's surrogate reads.

The observer of `kvcore.model.attention` sees queries, keys and values, not the hidden state they were projected
from, so `tapped(model, seen)` wraps every `model.layers[i].self_attn` for the duration of one forward pass and
hands `seen(i, x)` each call's input rows x [N, hidden] (batch 0), in the order the positions arrive. The caller
keeps only what it needs of them (a surrogate's scores, a sample of rows), so memory stays one chunk's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn

#: seen(layer, rows [N, hidden]) for every attention call inside `tapped`.
InputObserver = Callable[[int, mx.array], None]


class _InputTap(nn.Module):
    """One layer's attention during a tap: the same output; its input rows shown to the observer first."""

    def __init__(self, inner: nn.Module, layer: int, seen: InputObserver) -> None:
        super().__init__()
        self.inner = inner
        self._layer = layer
        self._seen = seen

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        self._seen(self._layer, x[0])
        return self.inner(x, *args, **kwargs)


@contextmanager
def tapped(model: nn.Module, seen: InputObserver) -> Iterator[None]:
    """Wrap each layer's `self_attn` so `seen(layer, rows)` gets its input; restore the modules on exit.

    ValueError (one line) when the model has no `layers` with `self_attn` modules to read from."""
    layers = getattr(model, "layers", None)
    wrapped = [
        (i, layer, layer["self_attn"])
        for i, layer in enumerate(layers or [])
        if isinstance(layer, nn.Module) and isinstance(layer.get("self_attn"), nn.Module)
    ]
    if not wrapped:
        raise ValueError(
            "this model has no layers[i].self_attn modules, so the attention input cannot be read: "
            "choose a method that scores keys or queries"
        )
    try:
        for i, layer, attn in wrapped:
            layer.self_attn = _InputTap(attn, i, seen)
        yield
    finally:
        for _, layer, attn in wrapped:
            layer.self_attn = attn
