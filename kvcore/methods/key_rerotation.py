"""key_rerotation (kvpress's KeyRerotationPress, as in SinkCache and FINCH): kept keys moved to contiguous
positions.

Which positions are kept is the inner method's; what is stored changes: the key that sat at prompt position p and
is now the i-th kept row of its kv-head is rotated by RoPE through i − p, so the kept keys look like a prompt of n
consecutive tokens. Queries continue at the prompt's length, as kvpress's pipeline places them. Uses each layer's
own rope module (its frequencies and scaling); the keys must be stored unquantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache.sparse import SparseKVCache
from kvcore.methods.wrapper import Wrapper


def rerotated(keys: mx.array, positions: np.ndarray, rope: Any) -> mx.array:
    """keys [H, n, D] of prompt `positions` [H, n] rotated by (row index − position): RoPE(a)·RoPE(b) = RoPE(a + b)."""
    n_heads, n, head_dim = keys.shape
    delta = (np.arange(n)[None, :] - positions).astype(np.int32).reshape(-1)
    rows = keys.reshape(
        n_heads * n, 1, 1, head_dim
    )  # one batch entry per row: rope takes one offset per entry
    return rope(rows, offset=mx.array(delta)).reshape(n_heads, n, head_dim)


def rerotate_cache(cache: list[Any], model: Any, label: str) -> list[Any]:
    """Every compressed layer's kept keys re-rotated in place to positions 0..n-1 (a fresh cache: the source is
    untouched); ValueError naming the fix for quantized or ragged keys or a model without rope modules."""
    layers = getattr(model, "layers", None)
    for i, layer in enumerate(cache):
        selection = getattr(layer, "_selection_np", None)
        if selection is None:
            continue
        rope = getattr(getattr(layers[i], "self_attn", None), "rope", None) if layers is not None else None
        if not isinstance(layer, SparseKVCache) or rope is None or layer.is_ragged:
            raise ValueError(
                f"{label} re-rotates unquantized keys through the layer's rope with the same count per "
                "kv-head: compress without key quantization, on a model whose attention has a rope module"
            )
        n = selection.shape[1]
        keys = layer.keys
        kept = rerotated(keys[0, :, :n], selection, rope)
        layer.keys = mx.concatenate([kept[None], keys[:, :, n:]], axis=2) if keys.shape[2] > n else kept[None]
    mx.eval([c.keys for c in cache if isinstance(c, SparseKVCache)])
    return cache


@dataclass(frozen=True)
class KeyRerotation(Wrapper):
    name = "key_rerotation"
    description = "The inner method's kept keys re-rotated (RoPE) to contiguous positions 0..n-1"
    paper = "none: kvpress's KeyRerotationPress (github.com/NVIDIA/kvpress), the re-rotation FINCH uses"
    default_inner = "snapkv"
    budget = "uniform"

    def store(self, cache: list[Any], model: Any, observations: Any = ()) -> list[Any]:
        return rerotate_cache(cache, model, self.label)
