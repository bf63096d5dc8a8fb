"""The test's own tap on what each layer's input norm hands its attention (kvzip+'s divisor, kvzap's input):
independent of kvcore's taps, so a test can check them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn


class _InputRows(nn.Module):
    def __init__(self, inner: nn.Module, outputs: list[mx.array]) -> None:
        super().__init__()
        self.inner = inner
        self._outputs = outputs

    def __call__(self, x: mx.array) -> mx.array:
        out = self.inner(x)
        self._outputs.append(out)
        return out


@contextmanager
def input_norm_outputs(model: Any) -> Iterator[list[mx.array]]:
    """Within the block, every call of a layer's `input_layernorm` appends its output to the yielded list (layer
    order within a forward pass); the norms are restored after."""
    outputs: list[mx.array] = []
    originals = [layer.input_layernorm for layer in model.layers]
    for layer, norm in zip(model.layers, originals, strict=True):
        layer.input_layernorm = _InputRows(norm, outputs)
    try:
        yield outputs
    finally:
        for layer, norm in zip(model.layers, originals, strict=True):
            layer.input_layernorm = norm
