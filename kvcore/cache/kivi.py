"""KIVI's cache: a packed body of whole token groups (keys transposed, per channel; values per token) and a float
residual of the most recent tokens, which takes every new token and hands its oldest group to the body when one
more than the residual has filled.

    body       tokens [0, n_body): keys as Kᵀ [B, H, head_dim, n_body] packed along tokens (kvcore.quant.kivi),
               values [B, H, n_body, head_dim] packed along head_dim; a side of width 16 stays float rows
    residual   the rest, a SparseKVCache (kvcore.cache.sparse): float rows, appended to by decoding

Every kv-head packs the same number of token groups (the body's arrays stay one block), each of its own kept
positions (`body_positions` [H, n_body]): under a per-head selection whose heads keep different counts (adakv), the
body holds the whole groups of the head keeping fewest, and the other heads' extra rows wait in the ragged residual
(its padding masked, as a ragged SparseKVCache's is). So every head keeps at least `residual` float rows.

Bytes are the stored arrays of both (codes, scales, biases, residual floats). Attention is genuine: the body's
scores are `quantized_matmul(q, Kᵀ, transpose=False)`, the residual's a float product, joined before one softmax
(as `kvcore.cache.residual.ResidualKVCache` joins its two stores), so the output equals attention over the
dequantized body followed by the float rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache.residual import residual_mask, two_part_mask
from kvcore.cache.sparse import SparseKVCache, copy_cache, take_rows, validate_widths
from kvcore.defaults import UNQUANTIZED_BITS
from kvcore.model.attention import quantized_or_float_matmul
from kvcore.quant import QuantScheme
from kvcore.quant import get as get_scheme

__all__ = ["KiviKVCache", "kivi_cache"]


class KiviKVCache:
    """One layer packed the KIVI way (see the module docstring). mlx-lm reads `offset`, calls `update_and_fetch`
    and `make_mask`; `kvcore.model.attention.sdpa` sees `attend` and calls it."""

    def __init__(self, scheme: QuantScheme, bits: int, value_bits: int) -> None:
        validate_widths(bits, value_bits, scheme.group_size, quant=scheme.spec)
        self.scheme, self.bits, self.value_bits = scheme, bits, value_bits
        self.group_size = scheme.group_size
        self.body_keys: tuple[mx.array, ...] = ()
        self.body_values: tuple[mx.array, ...] = ()
        self.body_positions = np.zeros((0, 0), dtype=np.int32)  # [H, n_body]: each head's packed positions
        self.residual = SparseKVCache()

    @classmethod
    def from_float(cls, layer: Any, scheme: QuantScheme, bits: int, value_bits: int) -> KiviKVCache:
        """Pack a float layer's rows (a KVCache, or a SparseKVCache, its heads' counts equal or not): each head's
        oldest rows, as many whole groups as the head keeping fewest fills, into the body; the rest (at least
        `residual` rows a head) float. Lazy: the caller evaluates."""
        heads = [np.asarray(p) for p in _positions(layer)]
        counts = [len(p) for p in heads]
        scheme.check_tokens(min(counts))
        out = cls(scheme, bits, value_bits)
        n_body = scheme.n_packed(min(counts))
        out.residual = take_rows(layer, [np.arange(n_body, n, dtype=np.int64) for n in counts])
        if n_body:
            body = take_rows(layer, [np.arange(n_body, dtype=np.int64)] * len(heads))
            k, v = body.keys_and_values()
            out._append_body(k, v, np.stack([p[:n_body] for p in heads]))
        return out

    # -- what mlx-lm and kvcore read ------------------------------------------------------------------------------

    @property
    def offset(self) -> int:
        return self.residual.offset

    @property
    def keys(self) -> Any:
        return self.residual.keys

    @property
    def quant(self) -> str:
        return self.scheme.spec

    @property
    def mode(self) -> str:
        return self.scheme.mode

    @property
    def n_heads(self) -> int:
        return self.residual.n_heads

    @property
    def n_body(self) -> int:
        """Packed rows a head (every head packs as many)."""
        return int(self.body_positions.shape[1])

    @property
    def nbytes(self) -> int:
        """The body's codes, scales and biases (or float rows) and the residual's float rows."""
        return int(sum(a.nbytes for a in self.body_keys + self.body_values)) + self.residual.nbytes

    @property
    def kept_counts(self) -> np.ndarray:
        return self.residual.kept_counts + self.n_body

    @property
    def retained_positions(self) -> list[np.ndarray]:
        return [
            np.concatenate([self.body_positions[h] if self.n_body else p[:0], p])
            for h, p in enumerate(self.residual.retained_positions)
        ]

    def size(self) -> int:
        return self.n_body + self.residual.size()

    def empty(self) -> bool:
        return False

    def is_trimmable(self) -> bool:
        return False

    def branch(self) -> KiviKVCache:
        """An independent copy (`kvcore.cache.sparse.copy_cache` calls it)."""
        out = KiviKVCache(self.scheme, self.bits, self.value_bits)
        out.body_keys, out.body_values, out.body_positions = (
            self.body_keys,
            self.body_values,
            self.body_positions,
        )
        out.residual = copy_cache([self.residual])[0]
        return out

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Any:
        """None for one new token, "causal" for several (`attend` builds its own masks)."""
        return two_part_mask(self.size(), N, return_array, window_size, "kivi")

    # -- packing ---------------------------------------------------------------------------------------------------

    def _pack_side(self, x: mx.array, bits: int, keys: bool) -> tuple[mx.array, ...]:
        if bits == UNQUANTIZED_BITS:
            return (x,)
        return self.scheme.pack_keys(x, bits) if keys else self.scheme.pack(x, bits)

    def _append_body(self, k: mx.array, v: mx.array, positions: np.ndarray) -> None:
        """Pack whole groups of float rows and append them: along tokens, the keys' last axis when packed."""
        new_k = self._pack_side(k, self.bits, keys=True)
        new_v = self._pack_side(v, self.value_bits, keys=False)
        k_axis = -2 if self.bits == UNQUANTIZED_BITS else -1
        if self.body_keys:
            new_k = tuple(
                mx.concatenate([a, b], axis=k_axis) for a, b in zip(self.body_keys, new_k, strict=True)
            )
            new_v = tuple(
                mx.concatenate([a, b], axis=-2) for a, b in zip(self.body_values, new_v, strict=True)
            )
        self.body_keys, self.body_values = new_k, new_v
        old = self.body_positions if self.n_body else self.body_positions.reshape(len(positions), 0)
        self.body_positions = np.concatenate([old, positions], axis=1).astype(np.int32)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        """New tokens join the residual; then each whole group beyond `residual` older tokens (none of the new
        ones, which attend causally among themselves in the residual) is packed into the body — as many for every
        head, counted on the head keeping fewest float rows."""
        self.residual.update_and_fetch(keys, values)
        n_new, g = int(keys.shape[2]), self.group_size
        counts = [int(n) for n in self.residual.kept_counts]
        n_res = min(counts)
        n_pack = min(self.scheme.n_packed(n_res), (n_res - n_new) // g * g)
        if n_pack > 0:
            body = take_rows(self.residual, [np.arange(n_pack, dtype=np.int64)] * self.n_heads)
            positions = np.stack([p[:n_pack] for p in self.residual.retained_positions])
            self.residual = take_rows(self.residual, [np.arange(n_pack, n, dtype=np.int64) for n in counts])
            k, v = body.keys_and_values()
            self._append_body(k, v, positions)
        return (self.body_keys, self.residual.keys_and_values()[0]), (
            self.body_values,
            self.residual.keys_and_values()[1],
        )

    def dequantized_body(self) -> tuple[mx.array, mx.array]:
        """The body's float keys and values [B, H, n_body, head_dim] (what "dequantize, then attend" reads)."""
        if not self.n_body:  # nothing packed yet (every head keeps fewer than residual + a group)
            return tuple(x[:, :, :0] for x in self.residual.keys_and_values())
        k = (
            self.body_keys[0]
            if self.bits == UNQUANTIZED_BITS
            else self.scheme.unpack_keys(self.body_keys, self.bits)
        )
        v = (
            self.body_values[0]
            if self.value_bits == UNQUANTIZED_BITS
            else self.scheme.unpack(self.body_values, self.value_bits)
        )
        return k, v

    def body_view(self) -> _FloatRows:
        """The body as float rows with their positions (what the quantization-error view compares to dense)."""
        k, v = self.dequantized_body()
        return _FloatRows(k, v, self.body_positions, self.n_heads, self.group_size)

    # -- attention ---------------------------------------------------------------------------------------------------

    def attend(self, queries: mx.array, keys: Any, values: Any, scale: float) -> mx.array:
        """Softmax attention over the packed body and the float residual at once."""
        res_k, res_v = self.residual.keys_and_values()
        B, n_q_heads, L, D = queries.shape
        n_kv = res_k.shape[1]
        q = mx.reshape(queries * scale, (B, n_kv, n_q_heads // n_kv, L, D))
        g, n_body = self.group_size, self.n_body
        expand = lambda side: tuple(mx.expand_dims(x, 2) for x in side)  # noqa: E731 [B,H,..] -> [B,H,1,..]
        scores = []
        if n_body:  # packed Kᵀ: no transpose; float keys are rows, transposed as usual
            float_keys = self.bits == UNQUANTIZED_BITS
            scores.append(quantized_or_float_matmul(q, expand(self.body_keys), float_keys, g, self.bits))
        scores.append(q @ mx.swapaxes(mx.expand_dims(res_k, 2), -1, -2))
        joined = mx.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0]
        mask = residual_mask(self.residual, L)
        if mask is not None:
            mask = mx.broadcast_to(mask, (1, n_kv, L, mask.shape[-1]))
            if n_body:
                mask = mx.concatenate([mx.ones((1, n_kv, L, n_body), dtype=mx.bool_), mask], axis=-1)
            joined = mx.where(mx.expand_dims(mask, 2), joined, mx.finfo(joined.dtype).min)
        weights = mx.softmax(joined, axis=-1, precise=True)
        out = weights[..., n_body:] @ mx.expand_dims(res_v, 2)
        if n_body:
            out = out + quantized_or_float_matmul(
                weights[..., :n_body], expand(self.body_values), False, g, self.value_bits
            )
        return mx.reshape(out, (B, n_q_heads, L, D))


class _FloatRows:
    """Float rows in a sparse store's reading form: positions per head, `keys_and_values`, width 16."""

    bits = value_bits = UNQUANTIZED_BITS

    def __init__(
        self, k: mx.array, v: mx.array, positions: np.ndarray, n_heads: int, group_size: int
    ) -> None:
        self._k, self._v, self.group_size = k, v, group_size
        self.retained_positions = list(positions.reshape(n_heads, -1))
        self.n_kept = int(positions.shape[-1])
        self.quant = "affine"

    def keys_and_values(self) -> tuple[tuple[mx.array], tuple[mx.array]]:
        return (self._k,), (self._v,)


def _positions(layer: Any) -> list[np.ndarray]:
    """Each kv-head's stored positions, oldest first: a sparse layer's retained positions, a dense one's 0 … T−1."""
    if hasattr(layer, "retained_positions"):
        return layer.retained_positions
    n_heads = int(layer.keys.shape[1])
    return [np.arange(int(layer.offset), dtype=np.int32)] * n_heads


def kivi_cache(
    cache: Sequence[Any], scheme: QuantScheme | str, bits: int, value_bits: int | None = None
) -> list:
    """Every float full-attention layer (KVCache, SparseKVCache) packed as a KiviKVCache by `scheme` (a kivi
    scheme, or its spec: "kivi:residual=64"); other layers pass through. Evaluated in one `mx.eval`."""
    from mlx_lm.models.cache import KVCache

    scheme = get_scheme(scheme) if isinstance(scheme, str) else scheme
    value_bits = bits if value_bits is None else value_bits
    out: list[Any] = []
    for c in cache:
        if type(c) in (KVCache, SparseKVCache) and c.keys is not None:
            validate_widths(bits, value_bits, scheme.group_size, int(c.keys.shape[-1]), scheme.spec)
            c = KiviKVCache.from_float(c, scheme, bits, value_bits)
        out.append(c)
    mx.eval([a for c in out if isinstance(c, KiviKVCache) for a in _arrays(c)])
    return out


def _arrays(c: KiviKVCache) -> list[mx.array]:
    k, v = c.residual.keys_and_values()
    return [*c.body_keys, *c.body_values, k, v]
