"""The attention function kvcore installs into a model's modules.

mlx-lm models import `scaled_dot_product_attention` by name and build ONE mask, from `cache[0]`, for all layers.
Two things need more than that:

- ragged per-head caches (AdaKV budgets) store each layer's heads padded to its longest head. The padding differs
  per layer and per head, so the shared mask cannot express it: such a cache offers
  `per_head_mask(n_queries, n_q_heads, dtype)` ([1, n_q_heads or H_kv, n_queries, T_kv], causal part included;
  bool, or additive in the queries' dtype for one query on the fast path)
  and it replaces the shared mask for that layer. On CUDA a decode step over such a float layer runs
  `kvcore.kernels.ragged_decode` instead, which reads only each head's real rows (no mask);
- capture needs the post-RoPE queries, which `mx.fast.scaled_dot_product_attention` never returns (mlx issue
  2590): an observer set with `observing()` sees every call on its own thread. A latent (MLA) layer's call is
  shown to it in the form attention uses (`kvcore.model.mla`: one kv-head, queries and keys in latent space,
  `latent=True`), not as the per-head projections mlx-lm passes.

For caches without `per_head_mask` and no observer, this calls exactly what mlx-lm would.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base as mlx_base

from kvcore.defaults import UNQUANTIZED_BITS
from kvcore.kernels import ragged_decode
from kvcore.model import mla

_NAME = "scaled_dot_product_attention"
_ORIGINAL = "_kvlens_original_sdpa"
_local = threading.local()

#: observer(queries, keys, values, cache, scale, mask), plus `latent=True` for a latent layer (kvcore.model.mla).
Observer = Callable[..., None]


class UnsupportedArchitecture(ValueError):
    """The model's attention does not go through mlx-lm's shared attention function."""


def sdpa(
    queries: mx.array,
    keys: Any,
    values: Any,
    cache: Any,
    scale: float,
    mask: Any,
    sinks: mx.array | None = None,
) -> mx.array:
    """Drop-in for `mlx_lm.models.base.scaled_dot_product_attention` with per-head masks and observers."""
    observer = getattr(_local, "observer", None)
    if observer is not None:
        latent = mla.observed_form(queries, cache)
        if latent is None:
            observer(queries, keys, values, cache, scale, mask)
        else:
            observer(*latent, cache, scale, "causal", latent=True)
    per_head = getattr(cache, "per_head_mask", None)
    if per_head is not None and sinks is None and ragged_decode.applies(queries, keys, cache):
        return ragged_decode.attend(queries, keys, values, cache.ragged_meta(), scale)
    if per_head is not None:
        # The fast path wants the mask per query head; mlx-lm's quantized path takes it per kv-head.
        quantized = hasattr(cache, "bits")
        n_q_heads = None if quantized else queries.shape[1]
        head_mask = per_head(queries.shape[2], n_q_heads, None if quantized else queries.dtype)
        if head_mask is not None:
            mask = head_mask
    attend = getattr(cache, "attend", None)  # kvcore.cache.residual: a packed body and a float residual
    value_bits = getattr(cache, "value_bits", None)
    mode = getattr(
        cache, "mode", "affine"
    )  # the cache's quantization scheme (kvcore.quant), as mx.quantize names it
    rotation = rotation_of(getattr(cache, "scheme", None))
    simulated = simulated_of(getattr(cache, "scheme", None))
    split = value_bits is not None and (
        value_bits != cache.bits or mode != "affine" or rotation is not None or simulated is not None
    )
    if (attend is not None or split) and sinks is not None:
        raise ValueError("Quantized SDPA does not support attention sinks.")
    if attend is not None:
        return attend(queries, keys, values, scale)
    if split:
        return split_quantized_sdpa(
            queries,
            keys,
            values,
            scale,
            mask,
            cache.group_size,
            cache.bits,
            value_bits,
            mode,
            rotation,
            simulated,
        )
    return mlx_base.scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks)


def split_quantized_sdpa(
    queries: mx.array,
    q_keys: tuple[mx.array, ...],
    q_values: tuple[mx.array, ...],
    scale: float,
    mask: Any,
    group_size: int,
    key_bits: int,
    value_bits: int,
    mode: str = "affine",
    rotation: Any = None,
    simulated: Any = None,
) -> mx.array:
    """mlx-lm's quantized attention with keys and values packed at different widths (it takes one `bits`) or by a
    scheme other than affine (it takes no `mode`): attention runs on the packed form either way (genuine).

    Same steps as `mlx_lm.models.base.quantized_scaled_dot_product_attention`: scores from the packed keys,
    the mask (string "causal" aligned bottom-right, bool or additive, per kv-head), a precise softmax, then the
    weighted sum of the packed values; only the two `bits`, the `mode` and a scheme's `rotation` differ. A side of width 16 (UNQUANTIZED_BITS) is one
    float array and goes through a plain matmul. A `simulated` scheme's sides are dequantized and attended as floats.
    """
    B, n_q_heads, L, D = queries.shape
    n_kv_heads = q_keys[0].shape[-3]
    n_repeats = n_q_heads // n_kv_heads
    queries = queries * scale
    if n_repeats > 1:
        queries = mx.reshape(queries, (B, n_kv_heads, n_repeats, L, D))
        q_keys = tuple(mx.expand_dims(x, axis=-3) for x in q_keys)
        q_values = tuple(mx.expand_dims(x, axis=-3) for x in q_values)
    scores = quantized_or_float_matmul(queries, q_keys, True, group_size, key_bits, mode, rotation, simulated)
    if mask is not None:
        if isinstance(mask, str):
            q_len, k_len = scores.shape[-2:]
            mask = mx.arange(k_len - q_len, k_len)[:, None] >= mx.arange(k_len)[None]
        if n_repeats > 1 and mask.ndim > 3:
            mask = mx.expand_dims(mask, -3)
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    scores = mx.softmax(scores, axis=-1, precise=True)
    out = quantized_or_float_matmul(
        scores, q_values, False, group_size, value_bits, mode, rotation, simulated
    )
    if n_repeats > 1:
        out = mx.reshape(out, (B, n_q_heads, L, D))
    return out


def quantized_or_float_matmul(
    x: mx.array,
    parts: tuple[mx.array, ...],
    transpose: bool,
    group_size: int,
    bits: int,
    mode: str = "affine",
    rotation: Any = None,
    simulated: Any = None,
) -> mx.array:
    """x @ stored side (transposed for keys): packed parts (codes, scales and, for affine, biases) through
    quantized_matmul in the scheme's `mode`, a float array as it is.

    `rotation` (a scheme that packs rows as x·R, `rotation_of`): packed keys are met by rotated queries and the
    product with packed values is rotated back, so the result is the unrotated one (R orthogonal).
    `simulated` (a scheme without a packed-form product, `simulated_of`): the parts are dequantized by the scheme
    and multiplied as floats ("execution = simulated")."""
    if bits == UNQUANTIZED_BITS or simulated is not None:
        w = parts[0] if bits == UNQUANTIZED_BITS else simulated.unpack(tuple(parts), bits).astype(x.dtype)
        return x @ (mx.swapaxes(w, -1, -2) if transpose else w)
    if rotation is not None and transpose:
        x = rotation.rotate(x)
    out = mx.quantized_matmul(x, *parts, transpose=transpose, group_size=group_size, bits=bits, mode=mode)
    return rotation.unrotate(out) if rotation is not None and not transpose else out


def rotation_of(scheme: Any) -> Any:
    """The scheme itself when it rotates rows before packing (kvcore.quant.rotated), else None."""
    return scheme if hasattr(scheme, "rotate") and hasattr(scheme, "unrotate") else None


def simulated_of(scheme: Any) -> Any:
    """The scheme itself when attention cannot run on its packed form (`genuine` False), else None."""
    return scheme if scheme is not None and not getattr(scheme, "genuine", True) else None


def _attention_modules(model: nn.Module) -> list[Any]:
    """Every Python module of the model's classes that calls mlx-lm's attention function by name."""
    seen: dict[str, Any] = {}
    for m in [model, *model.modules()]:
        name = type(m).__module__
        mod = sys.modules.get(name)
        if mod is not None and name not in seen and hasattr(mod, _NAME):
            seen[name] = mod
    return list(seen.values())


def install(model: nn.Module) -> None:
    """Route the model's attention through `sdpa`; idempotent. Raises UnsupportedArchitecture if impossible."""
    modules = _attention_modules(model)
    if not modules:
        raise UnsupportedArchitecture(
            f"{type(model).__module__}: this architecture computes attention without mlx-lm's "
            "scaled_dot_product_attention, so KV Lens cannot see or compress its cache. "
            "Use a model whose attention goes through mlx_lm.models.base (llama, qwen, mistral, phi3, gemma...)."
        )
    mla.install(model)
    for mod in modules:
        if getattr(mod, _NAME) is not sdpa:
            setattr(mod, _ORIGINAL, getattr(mod, _NAME))
            setattr(mod, _NAME, sdpa)


def uninstall(model: nn.Module) -> None:
    """Restore the attention functions `install` replaced."""
    for mod in _attention_modules(model):
        if hasattr(mod, _ORIGINAL):
            setattr(mod, _NAME, getattr(mod, _ORIGINAL))
            delattr(mod, _ORIGINAL)


@contextmanager
def observing(observer: Observer) -> Iterator[None]:
    """Call `observer(queries, keys, values, cache, scale, mask)` before each attention on this thread."""
    previous = getattr(_local, "observer", None)
    _local.observer = observer
    kept = mla.start_recording()
    try:
        yield
    finally:
        _local.observer = previous
        mla.stop_recording(kept)
