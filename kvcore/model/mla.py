"""Multi-head latent attention (mlx-lm's `DeepseekV3Attention`: deepseek_v3, kimi_k2) in the form attention uses.

The layer caches one row per token shared by every query head: the latent (`kv_latent`, kv_lora_rank wide) as
the cache's keys and the RoPE key part (`k_pe`, qk_rope_head_dim wide) as its values. Its attention logits are
`scale · (embed_q(q_nope) · latent + q_pe · k_pe)`: one token passes the absorbed query against the latent itself,
several tokens pass q_nope against per-head keys `embed_q(latent)` (the same product) and the RoPE part arrives
as the additive mask. In latent space the layer is therefore multi-query attention with ONE kv-head of width
kv_lora_rank + qk_rope_head_dim: query `[embed_q(q_nope), q_pe]`, key `[latent, k_pe]`, values the latent. That
is what capture observes (`observed_form`), so every method scores the real attention weights, selection is
shared by all query heads, and the rows gathered are the stored latent and RoPE rows.

q_pe never reaches the attention function: `install` wraps each such layer's rope so that, while an observer is
set on the thread, its outputs (q_pe, then k_pe) are kept until that layer's attention call takes them.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.models.deepseek_v3 import DeepseekV3Attention

_local = threading.local()


class _KeptRope(nn.Module):
    """The layer's own rope, unchanged; while recording, its outputs are kept for the layer's attention call."""

    def __init__(self, rope: Any, attention: DeepseekV3Attention) -> None:
        super().__init__()
        self.rope = rope
        self._attention = weakref.ref(attention)  # not a child module: no cycle in the module tree

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        out = self.rope(x, offset)
        kept = getattr(_local, "kept", None)
        if kept is not None:
            kept.append((self._attention(), out))
        return out


def latent_layers(model: nn.Module) -> list[DeepseekV3Attention]:
    """The model's latent-cache attention modules, in module order."""
    return [m for m in model.modules() if isinstance(m, DeepseekV3Attention)]


def latent_dims(model: nn.Module) -> tuple[int, int] | None:
    """(kv_lora_rank, qk_rope_head_dim) of the cached rows, or None for a model without latent attention."""
    layers = latent_layers(model)
    return (layers[0].kv_lora_rank, layers[0].qk_rope_head_dim) if layers else None


def install(model: nn.Module) -> None:
    """Wrap every latent layer's rope (idempotent); computations and parameters are unchanged."""
    for attn in latent_layers(model):
        if not isinstance(attn.rope, _KeptRope):
            attn.rope = _KeptRope(attn.rope, attn)


def start_recording() -> list | None:
    """Keep rope outputs on this thread from now on; returns what was kept before (restore it when done)."""
    previous = getattr(_local, "kept", None)
    _local.kept = []
    return previous


def stop_recording(previous: list | None) -> None:
    _local.kept = previous


def observed_form(queries: mx.array, cache: Any) -> tuple[mx.array, mx.array, mx.array] | None:
    """(queries [B, H_q, L, r+p], keys [B, 1, T, r+p], values [B, 1, T, r]) as the attention call uses them, or
    None when this call is not a latent layer's (nothing kept) or its cache is not a plain KVCache."""
    kept = getattr(_local, "kept", None)
    if not kept:
        return None
    (attention, q_pe), _k_pe = kept[-2], kept[-1]
    kept.clear()
    if q_pe.shape[1:3] != queries.shape[1:3]:
        raise ValueError(
            f"{type(attention).__name__}: the rope outputs do not match its queries {queries.shape}: this "
            "mlx-lm version computes latent attention differently; use mlx-lm 0.32"
        )
    if type(cache) is not KVCache:
        return None
    # mlx-lm's own branch: one token arrives absorbed already, several tokens as q_nope.
    absorbed = queries if queries.shape[2] == 1 else attention.embed_q(queries)
    keys = cached_keys(cache)[None]
    return (
        mx.concatenate([absorbed, q_pe.astype(absorbed.dtype)], axis=-1),
        keys,
        keys[..., : absorbed.shape[-1]],
    )


def cached_keys(layer: KVCache) -> mx.array:
    """[1, T, r+p]: a latent layer's keys as attention sees them (the latent and its RoPE key part)."""
    latent, rope_keys = layer.keys[0, :, : layer.offset], layer.values[0, :, : layer.offset]
    return mx.concatenate([latent, rope_keys], axis=-1)
