"""Field checks for a cache layer read from a file, before any cache object is built from it.

The SHA-256 digest in a cache file catches accidents (a flipped bit, a cut-off copy), not nonsense: anyone can
recompute it. So every field a layer is built from is checked here for its type, range, shape and dtype, and a
bad one is refused with a ValueError that names the layer and the field, e.g. "layer 3: offset -7 is negative".
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from kvcore.cache.sparse import scheme_for, validate_quantization, validate_widths
from kvcore.defaults import DEFAULT_QUANT, UNQUANTIZED_BITS
from kvcore.quant import QuantScheme
from kvcore.quant import get as get_scheme

FLOAT_DTYPES = (mx.float16, mx.bfloat16, mx.float32)
INDEX_DTYPES = (mx.int32, mx.int64, mx.uint32)


def _int(info: dict[str, Any], name: str, where: str) -> int:
    """info[name] as a non-negative int (bool is refused: JSON true is not a count)."""
    value = info.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{where}: {name} {value} is negative")
    return value


def _shape(x: mx.array, ndim: int, name: str, where: str) -> tuple[int, ...]:
    if x.ndim != ndim:
        raise ValueError(f"{where}: {name} has {x.ndim} dimensions {tuple(x.shape)}, expected {ndim}")
    return tuple(x.shape)


def check_rows(keys: tuple[mx.array, ...], values: tuple[mx.array, ...], info: dict, where: str) -> int:
    """Check the stored key/value arrays (each side 1 part, or packed, scales (, biases)) and return their row count.
    Affine scales and biases are floats (also under a rotation); the microscaling schemes' scales are one byte."""
    quant = info.get("quant", DEFAULT_QUANT)
    try:
        float_scales = get_scheme(quant).mode == "affine"
    except ValueError:
        float_scales = False
    for kind, parts in (("keys", keys), ("values", values)):
        quantized = len(parts) > 1
        names = ("packed", "scales", "biases")[: len(parts)] if quantized else (kind,)
        shapes = [_shape(p, 4, f"{kind}.{j}", where) for j, p in enumerate(parts)]
        if shapes[0][0] != 1:
            raise ValueError(f"{where}: {kind} batch is {shapes[0][0]}, expected 1")
        if any(s[:3] != shapes[0][:3] for s in shapes):
            raise ValueError(f"{where}: {kind} parts disagree on [batch, heads, rows]: {shapes}")
        if quantized and _own_layout(info):  # a scheme whose parts are not mx.quantize's checks them itself
            bits = info.get("value_bits", info["bits"]) if kind == "values" else info["bits"]
            refusal = scheme_for(quant, info["group_size"]).layout_refusal(parts, bits, kind == "values")
            if refusal is not None:
                raise ValueError(f"{where}: {kind} {refusal}")
            continue
        for j, p in enumerate(parts):
            want = (
                (mx.uint32,)
                if quantized and j == 0
                else FLOAT_DTYPES
                if j == 0 or float_scales
                else (mx.uint8,)
            )
            if p.dtype not in want:
                raise ValueError(f"{where}: {kind} {names[j]} dtype {p.dtype}, expected one of {list(want)}")
        if quantized:
            bits = info.get("value_bits", info["bits"]) if kind == "values" else info["bits"]
            group = info["group_size"]
            dim = shapes[0][3] * 32 // bits
            if shapes[1][3] * group != dim:
                raise ValueError(
                    f"{where}: {kind} scales width {shapes[1][3]} does not match head_dim {dim} / group {group}"
                )
    if _parts_shape(keys)[:3] != _parts_shape(values)[:3]:
        raise ValueError(
            f"{where}: keys {_parts_shape(keys)} and values {_parts_shape(values)} disagree on [batch, heads, rows]"
        )
    return int(keys[0].shape[2])


def _own_layout(info: dict) -> bool:
    """Whether the layer's scheme stores parts of its own layout (kvcore.quant's `own_layout`)."""
    try:
        return get_scheme(info.get("quant", DEFAULT_QUANT)).own_layout
    except ValueError:
        return False


def _parts_shape(parts: tuple[mx.array, ...]) -> tuple[int, ...]:
    return tuple(parts[0].shape)


def check_dense(rows: int, offset: int, where: str) -> None:
    """A dense or quantized layer stores exactly `offset` rows."""
    if rows != offset:
        raise ValueError(f"{where}: offset {offset} but {rows} stored rows (a dense layer stores every one)")


def check_selection(
    info: dict[str, Any], selection: mx.array, rows: int, offset: int, heads: int, where: str
) -> None:
    """A sparse layer: selection [H, n_prefix] of sorted positions < offset − appended, counts in range."""
    if selection.dtype not in INDEX_DTYPES:
        raise ValueError(f"{where}: selection dtype {selection.dtype}, expected an integer type")
    n_heads, n_prefix = _shape(selection, 2, "selection", where)
    if n_heads != heads:
        raise ValueError(f"{where}: selection has {n_heads} heads, keys have {heads}")
    if n_prefix > rows:
        raise ValueError(f"{where}: selection width {n_prefix} exceeds the {rows} stored rows")
    appended = rows - n_prefix
    if appended > offset:
        raise ValueError(f"{where}: {appended} appended rows but offset is only {offset}")
    counts = info.get("prefix_counts")
    if not isinstance(counts, list) or len(counts) != heads:
        raise ValueError(f"{where}: prefix_counts must be a list of {heads} integers, got {counts!r}")
    for h, c in enumerate(counts):
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= n_prefix:
            raise ValueError(f"{where}: prefix_counts[{h}] = {c!r}, expected an integer in 0..{n_prefix}")
    kept = info.get("kept_counts")
    if kept is not None and kept != [c + appended for c in counts]:
        raise ValueError(f"{where}: kept_counts {kept} != prefix_counts + {appended} appended rows")
    limit = offset - appended
    sel = np.asarray(selection).astype(np.int64)
    for h, c in enumerate(counts):
        p = sel[h, :c]
        if p.size and (p.min() < 0 or p.max() >= limit):
            raise ValueError(f"{where}: head {h} keeps positions outside 0..{limit - 1}")
        if p.size > 1 and np.any(np.diff(p) <= 0):
            raise ValueError(f"{where}: head {h} positions are not strictly increasing")


def check_header_layer(info: Any, where: str) -> None:
    """The scalar fields every layer has: a JSON object, offset, and bits/group size when quantized."""
    if not isinstance(info, dict):
        raise ValueError(f"{where}: layer metadata must be a JSON object, got {type(info).__name__}")
    offset = _int(info, "offset", where)
    if "bits" in info or "group_size" in info:
        try:
            quant = info.get("quant", DEFAULT_QUANT)
            if "value_bits" in info:
                validate_widths(info.get("bits"), info["value_bits"], info.get("group_size"), quant=quant)
            else:
                validate_quantization(info.get("bits"), info.get("group_size"), quant=quant)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
    if info.get("empty") not in (None, True):
        raise ValueError(f"{where}: empty must be true when present, got {info.get('empty')!r}")
    if info.get("empty") and offset != 0:
        raise ValueError(f"{where}: an empty layer has offset 0, got {offset}")


def check_kivi_header(info: dict[str, Any], where: str) -> QuantScheme:
    """A KIVI layer's scalars: a per-channel scheme spec, both widths, a whole number of packed rows, its offset
    that of its residual; the scheme at the layer's group size."""
    quant = info.get("quant")
    try:
        scheme = get_scheme(str(quant), group_size=info.get("group_size"))
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from None
    if not scheme.per_channel_keys:
        raise ValueError(f"{where}: a KiviKVCache is packed by a per-channel scheme (kivi), not {quant!r}")
    if "value_bits" not in info:
        raise ValueError(f"{where}: a KiviKVCache needs value_bits")
    n_body = _int(info, "n_body", where)
    if n_body % scheme.group_size:
        raise ValueError(f"{where}: n_body {n_body} is not whole groups of {scheme.group_size} tokens")
    residual = info.get("residual")
    if not isinstance(residual, dict) or residual.get("class") != "SparseKVCache":
        raise ValueError(f"{where}: residual must be a SparseKVCache layer's metadata")
    if residual.get("offset") != info["offset"]:
        raise ValueError(f"{where}: offset {info['offset']} but the residual's is {residual.get('offset')!r}")
    return scheme


def check_kivi_body(
    keys: tuple[mx.array, ...],
    values: tuple[mx.array, ...],
    positions: mx.array,
    info: dict,
    residual: Any,
    where: str,
) -> np.ndarray:
    """The packed body of a KIVI layer: Kᵀ parts [1, H, D, ·] packed along tokens (or float rows), values per token,
    positions [H, n_body] increasing, every one before its head's residual rows; returns the positions as int32."""
    n_body, g = info["n_body"], info["group_size"]
    res_k = residual.keys_and_values()[0]
    heads, dim = int(res_k.shape[1]), int(res_k.shape[3])
    for side, parts, bits in (("body_keys", keys, info["bits"]), ("body_values", values, info["value_bits"])):
        transposed = side == "body_keys" and bits != UNQUANTIZED_BITS
        rows, cols = (dim, n_body) if transposed else (n_body, dim)
        if bits == UNQUANTIZED_BITS:
            want = [((1, heads, rows, cols), FLOAT_DTYPES)]
        else:
            want = [((1, heads, rows, cols * bits // 32), (mx.uint32,))] + [
                ((1, heads, rows, cols // g), FLOAT_DTYPES)
            ] * 2
        for j, (p, (shape, dtypes)) in enumerate(zip(parts, want, strict=True)):
            if tuple(p.shape) != shape or p.dtype not in dtypes:
                raise ValueError(
                    f"{where}: {side}.{j} is {p.dtype} {list(p.shape)}, expected one of {list(dtypes)} {list(shape)}"
                )
    if positions.dtype not in INDEX_DTYPES or tuple(positions.shape) != (heads, n_body):
        raise ValueError(
            f"{where}: body_positions is {positions.dtype} {list(positions.shape)}, expected int [{heads}, {n_body}]"
        )
    pos = np.asarray(positions).astype(np.int64)
    for h, later in enumerate(residual.retained_positions):
        first = int(later[0]) if len(later) else int(info["offset"])
        if pos[h].min() < 0 or pos[h].max() >= first or np.any(np.diff(pos[h]) <= 0):
            raise ValueError(
                f"{where}: head {h}'s body positions must increase from 0 and come before its residual's ({first})"
            )
    return pos.astype(np.int32)
