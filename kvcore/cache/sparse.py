"""KV caches that keep a subset of token positions, per layer and per kv-head, on top of mlx-lm 0.32.

mlx-lm stores post-RoPE keys and values as [B, H_kv, T, head_dim] with a logical `offset` that RoPE uses for the
next token. The caches here keep only some rows (positions) yet keep `offset` logical, so appended tokens get their
true positions while kept keys carry their own, already rotated in.

Layout of a sparse layer (both the fp and the packed-quantized form):

    rows [0, n_prefix)          the selection; head h's first `prefix_counts[h]` rows are real, the rest padding
    rows [n_prefix, n_rows)     appended tokens, written at the same row in every head
    rows [n_rows, capacity)     spare room, grown in steps of 256 so a decode step never copies the layer

A layer whose heads keep different counts (AdaKV budgets, "ragged") is stored padded to its longest head: one array
and one fused attention call per layer, with memory really saved against dense. The padding is hidden from attention
by `per_head_mask`, which `kvcore.model.attention.sdpa` uses in place of the model's shared mask (mlx-lm builds that one
from `cache[0]`, so it cannot describe one layer's padding). Layers with equal counts need no per-head mask:
`make_mask` returns "causal" for several new tokens, which both attention paths align bottom-right, correct for any
kept count, and None for one.

Position indices given to `select_positions` are rows of each head's retained content: for a dense cache these are
the token positions themselves; for a sparse cache they index its `retained_positions`, so selections compose.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from kvcore.cache import index_checks
from kvcore.defaults import DEFAULT_GROUP_SIZE, DEFAULT_QUANT, UNQUANTIZED_BITS
from kvcore.model.loading import dtype_name
from kvcore.quant import QuantScheme
from kvcore.quant import get as get_scheme

STEP = 256

__all__ = [
    "SparseKVCache",
    "SparseQuantizedKVCache",
    "cache_tensor_bytes",
    "compressible_layers",
    "copy_cache",
    "dense_bytes_formula",
    "dequantized",
    "incompressible_reason",
    "quantize_cache",
    "select_positions",
    "sliding_window",
    "take_rows",
    "to_sparse_all",
    "validate_quantization",
    "validate_widths",
]


def scheme_for(quant: str = DEFAULT_QUANT, group_size: int = DEFAULT_GROUP_SIZE) -> QuantScheme:
    """The scheme `quant` (kvcore.quant) at `group_size`, or at its own where the format fixes one (mxfp4 32, nvfp4
    16): the caches take affine's arguments for every scheme. ValueError naming what is allowed otherwise."""
    groups = get_scheme(quant).allowed_group_sizes
    return get_scheme(quant, group_size=groups[0] if len(groups) == 1 else group_size)


def validate_quantization(
    bits: int, group_size: int, head_dim: int | None = None, quant: str = DEFAULT_QUANT
) -> None:
    """Raise a one-line ValueError that says what the scheme allows, before mx.quantize fails less helpfully."""
    get_scheme(quant, group_size=group_size).check(bits, head_dim)


def validate_widths(
    key_bits: int,
    value_bits: int,
    group_size: int,
    head_dim: int | None = None,
    quant: str = DEFAULT_QUANT,
) -> None:
    """Split widths: each side packed (a width the scheme allows) or kept in its float dtype (UNQUANTIZED_BITS),
    not both fp."""
    if key_bits == UNQUANTIZED_BITS and value_bits == UNQUANTIZED_BITS:
        raise ValueError(
            f"key_bits and value_bits are both {UNQUANTIZED_BITS}: nothing to pack; use SparseKVCache"
        )
    for bits in (key_bits, value_bits):
        if bits != UNQUANTIZED_BITS:
            validate_quantization(bits, group_size, head_dim, quant)


def dequantized(
    parts: Sequence[mx.array], group_size: int, bits: int, quant: str = DEFAULT_QUANT
) -> mx.array:
    """The float rows a stored side holds: unpacked by the scheme, or the float array itself (bits 16)."""
    if bits == UNQUANTIZED_BITS:
        return parts[0]
    return scheme_for(quant, group_size).unpack(tuple(parts), bits)


def _parts(x: Any) -> tuple[mx.array, ...]:
    """The stored arrays of keys or values: one fp array, or (packed, scales, biases)."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _rows(buf: mx.array, n: int) -> mx.array:
    return buf if buf.shape[2] == n else buf[..., :n, :]


class _SparseRows:
    """Row bookkeeping shared by the fp and the quantized sparse cache (see the module docstring for the layout).

    `_selection` [H_kv, n_prefix] int32 holds the logical positions of the selected rows (padding entries are
    arbitrary); `_prefix_counts` [H_kv] how many of them are real per head. Appends only move `_n_rows` and
    `offset`, so per-token cost is the slice write alone; positions and counts are derived on demand.
    """

    keys: Any
    values: Any
    offset: int

    def _reset(self) -> None:
        self.keys = None
        self.values = None
        self.offset = 0
        self._selection: mx.array | None = None
        self._prefix_counts: np.ndarray | None = None
        self._n_rows = 0
        self._pad_valid: mx.array | None = None
        self._decode_valid: tuple[tuple[int, str], mx.array] | None = None
        self._ragged_meta: mx.array | None = None
        self._selection_np: np.ndarray | None = None

    def _set_rows(
        self, keys: Any, values: Any, selection: mx.array, prefix_counts: np.ndarray, offset: int
    ) -> None:
        self.keys, self.values = keys, values
        self._selection = selection
        self._prefix_counts = np.asarray(prefix_counts, dtype=np.int32)
        self._n_rows = int(_parts(keys)[0].shape[2])
        self.offset = int(offset)
        self._pad_valid = None
        self._decode_valid = None
        self._ragged_meta = None
        self._selection_np = None

    # Stored form: subclasses turn new fp keys into their stored parts and back.
    def _encode(self, x: mx.array) -> tuple[mx.array, ...]:
        raise NotImplementedError

    def _wrap(self, parts: Sequence[mx.array]) -> Any:
        raise NotImplementedError

    def _encode_values(self, x: mx.array) -> tuple[mx.array, ...]:
        """Values' stored parts; the quantized cache packs them at their own width (split K/V bits)."""
        return self._encode(x)

    @property
    def n_heads(self) -> int:
        return 0 if self.keys is None else int(_parts(self.keys)[0].shape[1])

    @property
    def n_prefix(self) -> int:
        """Stored rows that came from the selection (padded width for a ragged layer)."""
        return 0 if self._selection is None else int(self._selection.shape[1])

    @property
    def n_appended(self) -> int:
        return self._n_rows - self.n_prefix

    @property
    def n_kept(self) -> int:
        """Rows attention sees per head: every head's kept count, or the padded width when ragged."""
        return self._n_rows

    @property
    def is_ragged(self) -> bool:
        return self._prefix_counts is not None and bool(np.any(self._prefix_counts != self.n_prefix))

    @property
    def kept_counts(self) -> np.ndarray:
        """Real positions kept per kv-head, [H_kv] int: selection plus every appended token."""
        if self._prefix_counts is None:
            return np.zeros(0, dtype=np.int64)
        return self._prefix_counts.astype(np.int64) + self.n_appended

    @property
    def retained_positions(self) -> list[np.ndarray]:
        """Logical token position of each real stored row, one int32 array per kv-head, in row order."""
        if self._selection is None:
            return []
        selection = self._selection_host()
        tail = np.arange(self.offset - self.n_appended, self.offset, dtype=np.int32)
        return [np.concatenate([selection[h, :n], tail]) for h, n in enumerate(self._prefix_counts.tolist())]

    def _selection_host(self) -> np.ndarray:
        """`_selection` as int32 NumPy, read back once (select_positions sets it from the host, no read-back)."""
        if self._selection_np is None:
            self._selection_np = np.asarray(self._selection, dtype=np.int32)
        return self._selection_np

    def size(self) -> int:
        return self._n_rows

    def empty(self) -> bool:
        return self.keys is None

    def is_trimmable(self) -> bool:
        return False

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> Any:
        """None for one new token, "causal" for several: bottom-right aligned, right for any kept count.

        `return_array=True` gets an explicit bottom-right mask sized for this layer, which is only right for the
        other layers when they store as many rows; mlx-lm's llama/qwen families never ask for it.
        """
        if window_size is not None:
            raise ValueError(
                f"window_size={window_size}: a sliding-window mask over logical positions cannot be built "
                "for a sparse layer; sliding-window layers must stay uncompressed (pass None for them)"
            )
        if N == 1:
            return None
        if return_array:
            total = self._n_rows + N
            return mx.arange(self._n_rows, total)[:, None] >= mx.arange(total)[None]
        return "causal"

    def per_head_mask(
        self, n_queries: int, n_q_heads: int | None = None, dtype: mx.Dtype | None = None
    ) -> mx.array | None:
        """[1, n_q_heads or H_kv, n_queries, n_rows] mask for a ragged layer (padding off, new tokens causal).

        None for a layer whose heads keep equal counts. Called by `kvcore.model.attention.sdpa` after `update_and_fetch`,
        so the queries are the last appended rows; n_q_heads repeats the mask over each GQA group (fast path).
        Bool, or with `dtype` the decode (one-query) mask is additive in that dtype (0 kept, -inf padding): MLX's
        CUDA attention takes no bool mask and would convert it at every call.
        """
        if not self.is_ragged:
            return None
        repeat = 1 if n_q_heads is None else n_q_heads // self.n_heads
        n_prefix, n_app = self.n_prefix, self.n_appended
        if n_queries == 1:
            return self._decode_mask(n_prefix + n_app, repeat, dtype)
        if self._pad_valid is None:
            valid = np.arange(n_prefix)[None, :] < self._prefix_counts[:, None]
            self._pad_valid = mx.array(valid)[None, :, None, :]
        h = self.n_heads
        causal = mx.arange(n_app - n_queries, n_app)[:, None] >= mx.arange(n_app)[None]
        mask = mx.concatenate(
            [
                mx.broadcast_to(self._pad_valid, (1, h, n_queries, n_prefix)),
                mx.broadcast_to(causal[None, None], (1, h, n_queries, n_app)),
            ],
            axis=-1,
        )
        return mx.repeat(mask, repeat, axis=1) if repeat > 1 else mask

    def _decode_mask(self, n_rows: int, repeat: int, dtype: mx.Dtype | None = None) -> mx.array:
        """[1, H_kv·repeat, 1, n_rows] for one new token: a slice of a mask kept at buffer capacity.

        A decoded token sees every stored row but the padding, so the mask only changes when the selection does
        or the buffer grows; building it once (not per token and layer) keeps ragged decode from allocating,
        concatenating, repeating or converting a mask each step.
        """
        cached, key = self._decode_valid, (repeat, str(dtype))
        if cached is None or cached[0] != key or cached[1].shape[-1] < n_rows:
            capacity = max(n_rows, int(_parts(self.keys)[0].shape[2]))
            valid = np.ones((self.n_heads, capacity), dtype=bool)
            valid[:, : self.n_prefix] = np.arange(self.n_prefix)[None, :] < self._prefix_counts[:, None]
            mask = mx.array(np.repeat(valid, repeat, axis=0))[None, :, None, :]
            if dtype is not None:
                mask = mx.where(mask, mx.array(0, dtype), mx.array(-mx.inf, dtype))
            mx.eval(mask)
            cached = (key, mask)
            self._decode_valid = cached
        return cached[1][..., :n_rows]

    def ragged_meta(self) -> mx.array:
        """int32 [H_kv + 1]: each head's real selection rows, then the padded width (`kvcore.kernels.ragged_decode`
        reads only those rows and the appended ones); made once per selection."""
        if self._ragged_meta is None:
            meta = np.append(self._prefix_counts, self.n_prefix).astype(np.int32)
            self._ragged_meta = mx.array(meta)
            mx.eval(self._ragged_meta)
        return self._ragged_meta

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        n_new = keys.shape[2]
        new_k, new_v = self._encode(keys), self._encode_values(values)
        if self.keys is None:
            self._set_rows(
                self._wrap(new_k),
                self._wrap(new_v),
                mx.zeros((keys.shape[1], 0), dtype=mx.int32),
                np.zeros(keys.shape[1], dtype=np.int32),
                self.offset,
            )
            self._n_rows = 0
        else:
            self._reserve(n_new)
            start = self._n_rows
            for buf, new in zip(_parts(self.keys) + _parts(self.values), new_k + new_v, strict=True):
                buf[..., start : start + n_new, :] = new
        self._n_rows += n_new
        self.offset += n_new
        return self.keys_and_values()

    def _reserve(self, n_new: int) -> None:
        """Grow every buffer by whole steps of 256 rows when the new rows do not fit."""
        capacity = _parts(self.keys)[0].shape[2]
        if self._n_rows + n_new <= capacity:
            return
        extra = -(-n_new // STEP) * STEP

        def grow(buf: mx.array) -> mx.array:
            spare = mx.zeros((*buf.shape[:2], extra, buf.shape[3]), dtype=buf.dtype)
            return mx.concatenate([_rows(buf, self._n_rows), spare], axis=2)

        self.keys = self._wrap([grow(b) for b in _parts(self.keys)])
        self.values = self._wrap([grow(b) for b in _parts(self.values)])

    def keys_and_values(self) -> tuple[Any, Any]:
        n = self._n_rows
        return (
            self._wrap([_rows(b, n) for b in _parts(self.keys)]),
            self._wrap([_rows(b, n) for b in _parts(self.values)]),
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the stored rows (padding included, spare capacity not)."""
        if self.keys is None:
            return 0
        total = 0
        for buf in _parts(self.keys) + _parts(self.values):
            total += buf.nbytes // buf.shape[2] * self._n_rows if buf.shape[2] else 0
        return int(total)

    def _state_rows(self) -> tuple[Any, Any, mx.array, mx.array, int]:
        k, v = self.keys_and_values()
        return k, v, self._selection, mx.array(self._prefix_counts), self.offset


class SparseKVCache(_SparseRows, KVCache):
    """Dense-dtype cache over kept positions with a logical offset; B0 and B3-B6 caches are this class.

    Differs from the seed: appends write into a buffer grown by 256 rows (no per-token copy), heads may keep
    different counts, and `retained_positions` / `kept_counts` stay right after appends. `n_kept` is a
    read-only property (rows per head, padded width when ragged).
    """

    def __init__(self) -> None:
        self._reset()

    def _encode(self, x: mx.array) -> tuple[mx.array, ...]:
        return (x,)

    def _wrap(self, parts: Sequence[mx.array]) -> mx.array:
        return parts[0]

    def to_quantized(
        self,
        group_size: int = DEFAULT_GROUP_SIZE,
        bits: int = 4,
        value_bits: int | None = None,
        quant: str = DEFAULT_QUANT,
    ) -> SparseQuantizedKVCache:
        """Pack the kept rows (B2 on top of a selection); layout, positions and offset are unchanged."""
        return quantize_cache([self], bits=bits, group_size=group_size, value_bits=value_bits, quant=quant)[0]

    @property
    def state(self) -> tuple[Any, ...]:
        return self._state_rows()

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        self._reset()
        keys, values, selection, counts, offset = v
        self._set_rows(keys, values, selection, np.asarray(counts), offset)


class SparseQuantizedKVCache(_SparseRows, QuantizedKVCache):
    """Packed cache over kept positions, packed by a quantization scheme (`quant`, kvcore.quant; default affine).

    `bits` is the keys' width (mlx-lm reads it), `value_bits` the values' (default: the same). Keys carry outlier
    channels and values do not, so 8-bit keys with 4-bit values is the usual split; equal widths run mlx-lm's
    quantized attention, split widths `kvcore.model.attention.split_quantized_sdpa`. One side may be 16
    (UNQUANTIZED_BITS): it is stored as its float array (one part, not packed, scales, biases), the other packed.
    A scheme with one group size (mxfp4 32, nvfp4 16) takes it whatever `group_size` says.
    """

    def __init__(
        self,
        group_size: int = DEFAULT_GROUP_SIZE,
        bits: int = 8,
        value_bits: int | None = None,
        quant: str = DEFAULT_QUANT,
    ) -> None:
        value_bits = bits if value_bits is None else value_bits
        self._reset()
        self._set_scheme(scheme_for(quant, group_size), bits, value_bits)

    def _set_scheme(self, scheme: QuantScheme, bits: int, value_bits: int) -> None:
        if scheme.per_channel_keys:
            raise ValueError(
                f"{scheme.name} packs keys per channel, along tokens: its layers are kvcore.cache.kivi.KiviKVCache "
                "(kivi_cache), not a row-packed cache"
            )
        validate_widths(bits, value_bits, scheme.group_size, quant=scheme.spec)
        self.scheme = scheme
        self.group_size = scheme.group_size  # mlx-lm reads it
        self.bits = bits
        self.value_bits = value_bits

    @property
    def quant(self) -> str:
        """The scheme's spec (its name, and its parameters off their defaults: kvcore.quant), as the state, files
        and CSVs carry it."""
        return self.scheme.spec

    @property
    def mode(self) -> str:
        """The scheme's mx.quantize mode: what `kvcore.model.attention` passes to mx.quantized_matmul."""
        return self.scheme.mode

    def _pack(self, x: mx.array, bits: int, values: bool = False) -> tuple[mx.array, ...]:
        if bits == UNQUANTIZED_BITS:
            return (x,)
        if x.shape[-1] % self.group_size:
            self.scheme.check(bits, x.shape[-1])
        return self.scheme.pack_values(x, bits) if values else self.scheme.pack(x, bits)

    def _encode(self, x: mx.array) -> tuple[mx.array, ...]:
        return self._pack(x, self.bits)

    def _encode_values(self, x: mx.array) -> tuple[mx.array, ...]:
        return self._pack(x, self.value_bits, values=True)

    def _wrap(self, parts: Sequence[mx.array]) -> tuple[mx.array, ...]:
        return tuple(parts)

    @property
    def state(self) -> tuple[Any, ...]:
        return (*self._state_rows(), self.group_size, self.bits, self.value_bits, self.quant)

    @state.setter
    def state(self, v: tuple[Any, ...]) -> None:
        """Older states end before value_bits (equal widths) or before the scheme (affine)."""
        self._reset()
        keys, values, selection, counts, offset, group_size, bits, *rest = v
        value_bits = int(rest[0]) if rest else int(bits)
        quant = str(rest[1]) if len(rest) > 1 else DEFAULT_QUANT
        self._set_scheme(scheme_for(quant, int(group_size)), int(bits), value_bits)
        self._set_rows(tuple(keys), tuple(values), selection, np.asarray(counts), offset)


# --------------------------------------------------------------------------------------------------------------
# Which layers can be compressed


def incompressible_reason(layer: Any) -> str | None:
    """None for a full-attention KV layer; otherwise why it is passed through untouched."""
    if type(layer) in (KVCache, QuantizedKVCache, SparseKVCache, SparseQuantizedKVCache):
        if layer.keys is None:
            return f"{type(layer).__name__} is empty (nothing prefilled yet)"
        return None
    name = type(layer).__name__
    if name == "RotatingKVCache":
        return "RotatingKVCache: sliding-window layer, its positions are already bounded by the window"
    if name in ("ArraysCache", "MambaCache"):
        return f"{name}: recurrent (SSM) state, not a per-position key/value cache"
    return f"{name}: not a plain mlx-lm KVCache, left untouched"


def sliding_window(layer: Any) -> int | None:
    """The window of a sliding-window layer (mlx-lm's RotatingKVCache), None for any other layer.

    Its steady state is the window: a one-pass prefill of T > window tokens leaves T rows, but the next token's
    update trims the layer to `max_size` rows, the last positions of the sequence.
    """
    return int(layer.max_size) if type(layer).__name__ == "RotatingKVCache" else None


def compressible_layers(cache: Sequence[Any]) -> list[bool]:
    """Per layer, whether select_positions / quantize_cache can act on it (others pass through untouched)."""
    return [incompressible_reason(c) is None for c in cache]


# --------------------------------------------------------------------------------------------------------------
# Reading a source layer


class _Source:
    """A compressible layer seen as per-head rows of stored parts; `cols(rows)` maps rows to buffer rows."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.quantized = hasattr(layer, "bits")
        self.k_parts = _parts(layer.keys)
        self.v_parts = _parts(layer.values)
        self.capacity = int(self.k_parts[0].shape[2])
        self.n_heads = int(self.k_parts[0].shape[1])
        if isinstance(layer, _SparseRows):
            self.n_stored = layer.n_kept
            self.rows_per_head = layer.kept_counts
            self.ragged = layer.is_ragged
        else:
            self.n_stored = int(layer.offset)
            self.rows_per_head = np.full(self.n_heads, self.n_stored, dtype=np.int64)
            self.ragged = False

    def cols(self, rows: np.ndarray) -> np.ndarray:
        """Buffer rows of per-head content rows [H_kv, n] (identity unless the layer is ragged)."""
        if not self.ragged:
            return rows
        prefix = self.layer._prefix_counts[:, None]
        return np.where(rows < prefix, rows, rows - prefix + self.layer.n_prefix).astype(np.int32)

    def flat(self, cols: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Gather index of buffer rows [H_kv, n] into the buffer flattened over (head, row)."""
        return np.add(cols, (np.arange(self.n_heads, dtype=np.int32) * self.capacity)[:, None], out=out)

    def positions(self, cols: np.ndarray) -> np.ndarray:
        """Logical positions of buffer rows [H_kv, n]."""
        if not isinstance(self.layer, _SparseRows):
            return cols
        layer = self.layer
        tail = np.arange(layer.offset - layer.n_appended, layer.offset, dtype=np.int32)
        by_col = np.concatenate(
            [layer._selection_host(), np.broadcast_to(tail[None], (self.n_heads, layer.n_appended))], axis=1
        )
        return np.take_along_axis(by_col, cols, axis=1)


def _empty_like(layer: Any) -> SparseKVCache | SparseQuantizedKVCache:
    """An empty sparse cache of the layer's kind (packed at the layer's widths when it is quantized)."""
    if hasattr(layer, "bits"):
        return SparseQuantizedKVCache(
            group_size=layer.group_size,
            bits=layer.bits,
            value_bits=getattr(layer, "value_bits", None),
            quant=getattr(layer, "quant", DEFAULT_QUANT),
        )
    return SparseKVCache()


def _head_offsets(n_heads: int, capacity: int) -> mx.array:
    """[H_kv, 1] int32 start of each head's rows in a buffer flattened over (head, row)."""
    return (mx.arange(n_heads, dtype=mx.int32) * capacity)[:, None]


#: Unsigned types a row is moved as, widest first: MLX's GPU gather moves one element per thread, so a bf16 row of
#: 128 read as 32 uint64 words moves in a quarter of the threads (measured on the H200: 2.3x -> 1.0x a plain copy).
_WORDS = ((8, mx.uint64), (4, mx.uint32), (2, mx.uint16))


def _gather(buf: mx.array, flat: mx.array) -> mx.array:
    """Rows of buf [B, H_kv, capacity, D] at `flat` ([H_kv, n] of head·capacity + row) in one gather, bytes
    unchanged: [B, H_kv, n, D]. Few graph nodes per part, since a 32-layer recompress builds ~10 per layer."""
    b, h, cap, d = buf.shape
    row_bytes = d * buf.itemsize
    word = next((t for size, t in _WORDS if row_bytes % size == 0 and size > buf.itemsize), None)
    src = buf.reshape(b, h * cap, d)
    if word is None:
        return mx.take(src, flat, axis=1)
    return mx.take(src.view(word), flat, axis=1).view(buf.dtype)


# --------------------------------------------------------------------------------------------------------------
# The seed's public functions


def _full_rows(layer: Any) -> SparseKVCache | SparseQuantizedKVCache:
    """B0 form of a KVCache / QuantizedKVCache: every position, zero-copy views of its rows."""
    n = int(layer.offset)
    h = _parts(layer.keys)[0].shape[1]
    selection = mx.broadcast_to(mx.arange(n, dtype=mx.int32)[None], (h, n))
    if hasattr(layer, "bits"):
        out = SparseQuantizedKVCache(group_size=layer.group_size, bits=layer.bits)  # mlx-lm's: affine
    else:
        out = SparseKVCache()
    k, v = (out._wrap([_rows(b, n) for b in _parts(x)]) for x in (layer.keys, layer.values))
    out._set_rows(k, v, selection, np.full(h, n, dtype=np.int32), n)
    out._selection_np = np.broadcast_to(np.arange(n, dtype=np.int32)[None], (h, n))
    return out


def _arrays(c: Any) -> list[mx.array]:
    if getattr(c, "keys", None) is None:
        return []
    k, v = c.keys_and_values()
    out = [*_parts(k), *_parts(v)]
    if isinstance(c, _SparseRows):
        out.append(c._selection)
    return out


def to_sparse_all(cache: Sequence[Any]) -> list:
    """B0: every full-attention layer as a sparse cache keeping all positions (the 100 % retention control).

    KVCache becomes SparseKVCache and mlx-lm's QuantizedKVCache becomes SparseQuantizedKVCache; sparse and other
    layers are returned as they are. The new layers share the source's rows until either side appends (MLX arrays
    are values, so neither sees the other's appends), which makes this O(1) in cache size.
    """
    out = [
        _full_rows(c) if type(c) in (KVCache, QuantizedKVCache) and c.keys is not None else c for c in cache
    ]
    mx.eval([a for c in out if c is not None for a in _arrays(c)])
    return out


def quantize_cache(
    cache: Sequence[Any],
    bits: int,
    group_size: int = DEFAULT_GROUP_SIZE,
    value_bits: int | None = None,
    quant: str = DEFAULT_QUANT,
) -> list:
    """B2: pack every fp full-attention layer's kept K/V with the scheme `quant` (storage and execution form).

    KVCache and SparseKVCache layers become SparseQuantizedKVCache with the same rows, positions and offset
    (ragged layers stay ragged); layers that are not KV caches pass through. Differs from the seed: a layer that is
    already quantized raises ValueError instead of TypeError, and everything is evaluated in one `mx.eval`.
    `bits` packs the keys, `value_bits` (default: `bits`) the values; either (not both) may be 16, that side then
    stays in its float dtype. A scheme with one group size (mxfp4 32, nvfp4 16) takes it whatever `group_size`
    says.
    """
    value_bits = bits if value_bits is None else value_bits
    scheme = scheme_for(quant, group_size)
    group_size = scheme.group_size
    validate_widths(bits, value_bits, group_size, quant=quant)
    out: list[Any] = []
    for i, c in enumerate(cache):
        if type(c) in (QuantizedKVCache, SparseQuantizedKVCache):
            raise ValueError(
                f"layer {i}: already quantized (bits={c.bits}, group_size={c.group_size}); "
                "quantize the fp cache instead of re-quantizing"
            )
        if type(c) is KVCache and c.keys is not None:
            c = _full_rows(c)
        if type(c) is not SparseKVCache or c.keys is None:
            out.append(c)
            continue
        validate_widths(bits, value_bits, group_size, int(c.keys.shape[-1]), quant)
        q = SparseQuantizedKVCache(group_size=group_size, bits=bits, value_bits=value_bits, quant=quant)
        k, v = c.keys_and_values()
        q._set_rows(q._encode(k), q._encode_values(v), c._selection, c._prefix_counts, c.offset)
        out.append(q)
    mx.eval([a for c in out for a in _arrays(c)])
    return out


def select_positions(
    cache: Sequence[Any],
    indices_per_layer: Sequence[Any],
    logical_offset: int | None = None,
    validate: bool = True,
    device_indices: Sequence[mx.array | None] | None = None,
) -> list:
    """B3-B6: a new cache keeping, per layer, the given rows of each kv-head.

    Per layer the entry is None (layer passed through untouched), a 1-D array [n] shared by all kv-heads, a 2-D
    array [H_kv, n], or a sequence of H_kv 1-D arrays of different lengths (ragged, stored padded and masked per
    head); numpy or mx integer arrays, each head's indices strictly increasing. Indices are rows of the layer's
    retained content (token positions for a dense layer). `logical_offset` (default: each layer's own offset) is
    the position the next token gets. The source is unchanged.
    Raises ValueError on a wrong number of layers or heads, empty, out-of-range, duplicated or unsorted indices.
    validate=False skips the range/order checks for indices that are valid by construction (kvcore.methods.selection's).

    Fixed cost per call, not per layer: indices are shaped and checked on the host (`kvcore.cache.index_checks`), every
    layer's flat gather index and kept positions travel to the device in one array, and the device runs only the
    gathers (one `take` per stored part and layer), all in one `mx.eval`.
    `device_indices` (with validate=False): the same indices already on the device, padded as `host_indices` pads
    them (`kvcore.methods.selection.device_select` builds them from a ranking kept there); a layer read from a dense
    source then uploads nothing, since on a GPU the host→device copy of the indices costs more than the gathers
    (the H200: 20 ms for 16 MB of them at 32k, against 2.7 ms for the gathers).
    """
    if device_indices is not None and validate:
        raise ValueError("device_indices are trusted as equal to indices_per_layer: pass validate=False")
    if len(indices_per_layer) != len(cache):
        raise ValueError(
            f"indices_per_layer has {len(indices_per_layer)} entries, the cache has {len(cache)} layers"
        )
    if logical_offset is not None and (isinstance(logical_offset, bool) or int(logical_offset) < 0):
        raise ValueError(f"logical_offset={logical_offset!r}: must be a non-negative int")
    on_device = index_checks.mx_arrays(indices_per_layer)
    if on_device:
        mx.eval(on_device)  # read back together below, not one layer at a time
    plans = []
    for i, (layer, idx) in enumerate(zip(cache, indices_per_layer, strict=True)):
        if idx is None:
            continue
        where = f"layer {i}"
        reason = incompressible_reason(layer)
        if reason is not None:
            raise ValueError(f"{where}: cannot select positions ({reason}); pass None for this layer")
        src = _Source(layer)
        rows, counts, _ = index_checks.host_indices(idx, src.n_heads, where)
        if validate:
            index_checks.check(rows, counts, src.rows_per_head, where)
        if rows.shape != (src.n_heads, rows.shape[-1]):
            rows = np.broadcast_to(rows, (src.n_heads, rows.shape[-1]))
        on_device = None if device_indices is None or isinstance(layer, _SparseRows) else device_indices[i]
        plans.append((i, layer, src, rows, counts, on_device))
    uploaded = [p for p in plans if p[5] is None]
    sizes = [r.size for _, _, _, r, _, _ in uploaded]
    host = np.empty(2 * sum(sizes), dtype=np.int32)  # per layer: flat gather index, then kept positions
    start = 0
    for (_, _, src, rows, _, _), size in zip(uploaded, sizes, strict=True):
        cols = src.cols(rows)
        flat = host[start : start + size].reshape(rows.shape)
        src.flat(cols, out=flat)
        host[start + size : start + 2 * size].reshape(rows.shape)[...] = src.positions(cols)
        start += 2 * size
    device = mx.array(host) if sizes else None
    out: list[Any] = list(cache)
    start = 0
    offsets: dict[tuple[int, int], mx.array] = {}
    for i, layer, src, rows, counts, on_device in plans:
        if on_device is None:
            size = rows.size
            flat = device[start : start + size].reshape(rows.shape)
            selection_np = host[start + size : start + 2 * size].reshape(rows.shape)
            selection = device[start + size : start + 2 * size].reshape(rows.shape)
            start += 2 * size
        else:  # a dense source: buffer rows are positions, and the head offsets are added on the device
            selection_np = rows
            selection = on_device if on_device.dtype == mx.int32 else on_device.astype(mx.int32)
            if tuple(selection.shape) != rows.shape:
                selection = mx.broadcast_to(selection, rows.shape)
            key = (src.n_heads, src.capacity)
            if key not in offsets:
                offsets[key] = _head_offsets(*key)
            flat = selection + offsets[key]
        k = [_gather(b, flat) for b in src.k_parts]
        v = [_gather(b, flat) for b in src.v_parts]
        new = _empty_like(layer)
        offset = layer.offset if logical_offset is None else int(logical_offset)
        new._set_rows(new._wrap(k), new._wrap(v), selection, counts, offset)
        new._selection_np = selection_np  # positions known on the host: no read-back when composing
        out[i] = new
    mx.eval([a for i, *_ in plans for a in _arrays(out[i])])
    return out


def take_rows(layer: Any, heads: Sequence[np.ndarray]) -> SparseKVCache | SparseQuantizedKVCache:
    """A sparse layer of rows `heads[h]` (sorted, valid by construction) of each kv-head; a head may keep none.

    `select_positions` refuses empty heads (a cache must attend to something); this is for one of several stores
    of a layer (kvcore.cache.residual), where another store holds that head's rows. Lazy: the caller evaluates.
    """
    src = _Source(layer)
    counts = np.array([len(p) for p in heads], dtype=np.int32)
    padded = np.zeros((src.n_heads, int(counts.max(initial=0))), dtype=np.int32)
    for h, p in enumerate(heads):
        padded[h, : len(p)] = p
    cols = src.cols(padded)
    flat = mx.array(src.flat(cols))
    new: Any = _empty_like(layer)
    k = [_gather(b, flat) for b in src.k_parts]
    v = [_gather(b, flat) for b in src.v_parts]
    positions = src.positions(cols).astype(np.int32)
    new._set_rows(new._wrap(k), new._wrap(v), mx.array(positions), counts, layer.offset)
    new._selection_np = positions
    return new


def _fresh(x: Any) -> Any:
    """A new array object with the same value, so one branch's in-place slice writes never reach the other."""
    return x[...] if isinstance(x, mx.array) else x


def copy_cache(cache: Sequence[Any]) -> list:
    """Independent branch of a cache: every layer, of any class, gets its own objects and array handles.

    Arrays are shared copy-on-write (MLX copies a buffer on the first write while another handle holds it), so
    a copy costs no memory until a branch appends. Pass-through layers (rotating, SSM) are copied the same way.
    """
    out = []
    for c in cache:
        if hasattr(c, "branch"):  # a layer made of stores (kvcore.cache.residual) copies each of them
            out.append(c.branch())
            continue
        n = copy.copy(c)
        for name, value in vars(c).items():
            setattr(n, name, tree_map(_fresh, value))
        out.append(n)
    mx.eval([a for c in out for _, a in tree_flatten(list(vars(c).values())) if isinstance(a, mx.array)])
    return out


def _layer_bytes(c: Any) -> int:
    window = sliding_window(c)
    if window is not None:  # the steady state: the window mlx-lm trims to at the next token
        if c.keys is None:
            return 0
        return int(sum(b.nbytes // b.shape[2] * min(c.offset, window) for b in (c.keys, c.values)))
    if isinstance(c, _SparseRows):
        return c.nbytes
    if type(c) in (KVCache, QuantizedKVCache):
        if c.keys is None:
            return 0
        return int(sum(b.nbytes // b.shape[2] * c.offset for b in _parts(c.keys) + _parts(c.values)))
    try:
        return int(c.nbytes)
    except (AttributeError, NotImplementedError):
        return 0


def cache_tensor_bytes(cache: Sequence[Any]) -> int:
    """Bytes of the stored K/V tensors over their logical content (trimmed rows, not buffer capacity).

    Sparse layers count their stored rows, padding included (it is really held); the int32 position bookkeeping is
    not counted. Sliding-window layers count the window they hold in steady state (`sliding_window`); other
    pass-through layers count their own `nbytes`.
    """
    return int(sum(_layer_bytes(c) for c in cache))


def dense_bytes_formula(
    n_layers: int, T: int, n_kv_heads: int, head_dim: int, bytes_per_scalar: int, B: int = 1
) -> int:
    """M_KV = 2·B·L·T·H_kv·d_h·s: the check that measured dense bytes must meet."""
    return 2 * B * n_layers * T * n_kv_heads * head_dim * bytes_per_scalar


def element_type(cache: Sequence[Any]) -> str:
    """The dense cache's element type by name ("float32", "bfloat16"): what "16 (off)" really stores."""
    for layer in cache:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, mx.array):
            return dtype_name(keys.dtype)
    return ""
