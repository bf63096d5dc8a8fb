"""Save and load KV caches (dense, quantized, sparse, ragged, KIVI) as safetensors arrays plus JSON metadata.

mlx-lm's `save_prompt_cache` cannot restore our classes (it looks class names up in its own module), and pickle
would run code from the file. The file here is a plain safetensors file: arrays named `<layer>.<field>` and one
metadata entry, `kvlens`, holding JSON with the format version, every layer's class and scalars, the caller's
metadata and a SHA-256 digest over that JSON and all array bytes, so truncation and tampering are detected before a
cache is built. Classes are looked up in a fixed table, never by an arbitrary name. Writes are atomic
(`kvcore.atomic`). A KIVI layer (`kvcore.cache.kivi`) stores its packed body (`body_keys.*`: Kᵀ codes, scales,
biases; `body_values.*`; `body_positions` [H, n_body]) and its float residual as a sparse layer under `residual.`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from kvcore.atomic import write_stream
from kvcore.cache import file_checks as cache_checks
from kvcore.cache.kivi import KiviKVCache
from kvcore.cache.sparse import SparseKVCache, SparseQuantizedKVCache, scheme_for
from kvcore.defaults import DEFAULT_QUANT, UNQUANTIZED_BITS

FORMAT = "kvlens-cache"
VERSION = 1
_KEY = "kvlens"
_CLASSES = {
    "KVCache": KVCache,
    "QuantizedKVCache": QuantizedKVCache,
    "SparseKVCache": SparseKVCache,
    "SparseQuantizedKVCache": SparseQuantizedKVCache,
    "KiviKVCache": KiviKVCache,
}


def _fields(layer: Any) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Arrays and JSON scalars of one layer."""
    if isinstance(layer, KiviKVCache):
        return _kivi_fields(layer)
    info: dict[str, Any] = {"class": type(layer).__name__, "offset": int(layer.offset)}
    if getattr(layer, "bits", None) is not None:
        info["bits"], info["group_size"] = int(layer.bits), int(layer.group_size)
        value_bits = getattr(layer, "value_bits", layer.bits)
        if value_bits != layer.bits:
            info["value_bits"] = int(value_bits)
        quant = getattr(layer, "quant", DEFAULT_QUANT)
        if quant != DEFAULT_QUANT:  # affine files stay as they were
            info["quant"] = quant
    if layer.keys is None:
        info["empty"] = True
        return {}, info
    k, v = layer.keys_and_values()
    arrays: dict[str, mx.array] = {}
    for name, x in (("keys", k), ("values", v)):
        parts = tuple(x) if isinstance(x, (tuple, list)) else (x,)
        for j, p in enumerate(parts):
            arrays[f"{name}.{j}"] = p
    if isinstance(layer, (SparseKVCache, SparseQuantizedKVCache)):
        _, _, selection, counts, _ = layer._state_rows()
        arrays["selection"] = selection
        info["prefix_counts"] = np.asarray(counts).tolist()
        info["kept_counts"] = layer.kept_counts.tolist()
    return arrays, info


def _kivi_fields(layer: KiviKVCache) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """A KIVI layer: its widths and spec, the packed body's parts and positions, the residual as a sparse layer."""
    res_arrays, res_info = _fields(layer.residual)
    info: dict[str, Any] = {
        "class": "KiviKVCache",
        "offset": int(layer.offset),
        "bits": int(layer.bits),
        "value_bits": int(layer.value_bits),
        "group_size": int(layer.group_size),
        "quant": layer.quant,
        "n_body": layer.n_body,
        "residual": res_info,
    }
    arrays = {f"residual.{k}": v for k, v in res_arrays.items()}
    if layer.n_body:
        arrays.update({f"body_keys.{j}": p for j, p in enumerate(layer.body_keys)})
        arrays.update({f"body_values.{j}": p for j, p in enumerate(layer.body_values)})
        arrays["body_positions"] = mx.array(layer.body_positions)
    return arrays, info


def _digest(header: dict[str, Any], arrays: dict[str, mx.array]) -> str:
    h = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
    for name in sorted(arrays):
        x = arrays[name]
        raw = np.asarray(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x)
        h.update(f"{name}|{x.dtype}|{tuple(x.shape)}|".encode())
        h.update(np.ascontiguousarray(raw).tobytes())
    return h.hexdigest()


def layer_arrays(
    cache: Sequence[Any], path: Path, prefix: str = ""
) -> tuple[dict[str, mx.array], list[dict]]:
    """Arrays named `<prefix><layer>.<field>` and each layer's JSON; a layer class we cannot restore is refused."""
    arrays: dict[str, mx.array] = {}
    layers = []
    for i, layer in enumerate(cache):
        if type(layer) not in _CLASSES.values():
            raise ValueError(
                f"{path}: layer {i} is a {type(layer).__name__}; only {sorted(_CLASSES)} layers can be saved"
            )
        fields, info = _fields(layer)
        arrays.update({f"{prefix}{i}.{k}": v for k, v in fields.items()})
        layers.append(info)
    return arrays, layers


def write_file(path: Path, arrays: dict[str, mx.array], header: dict[str, Any]) -> None:
    """Write arrays plus `header` (JSON, sealed with the digest) as one safetensors file, atomically."""
    try:
        json.dumps(header)
    except TypeError as e:
        raise ValueError(f"{path}: metadata must be JSON-serializable ({e})") from e
    mx.eval(list(arrays.values()))
    header = {**header, "sha256": _digest(header, arrays)}
    write_stream(path, lambda fh: mx.save_safetensors(fh, arrays, {_KEY: json.dumps(header, sort_keys=True)}))


def save_cache(path: str | os.PathLike, cache: Sequence[Any], metadata: dict | None = None) -> None:
    """Write `cache` (any mix of KVCache, QuantizedKVCache, SparseKVCache, SparseQuantizedKVCache, KiviKVCache)
    atomically.

    `metadata` must be JSON-serializable; it comes back from `load_cache`. Other layer classes (rotating window,
    SSM state) are refused with a ValueError rather than saved in a form that could not be restored faithfully.
    """
    path = Path(path)
    arrays, layers = layer_arrays(cache, path)
    write_file(
        path, arrays, {"format": FORMAT, "version": VERSION, "layers": layers, "metadata": metadata or {}}
    )


def _read_header(path: Path, fmt: str = FORMAT, version: int = VERSION) -> dict[str, Any]:
    """The kvlens JSON of a safetensors file, after checking the file is complete."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: truncated or not a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ValueError(
                f"{path}: truncated (header wants {n} bytes, file has {size - 8} after the length)"
            )
        try:
            table = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a safetensors file (header is not JSON: {e})") from e
        except RecursionError:
            raise ValueError(f"{path}: not a safetensors file (header JSON nested too deeply)") from None
    if not isinstance(table, dict):
        raise ValueError(f"{path}: not a safetensors file (header is not a JSON object)")
    meta = table.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(
            f"{path}: not a safetensors file (__metadata__ must be an object of strings, got "
            f"{type(meta).__name__}); the file was edited: save it again"
        )
    if _KEY not in meta:
        raise ValueError(
            f"{path}: not a KV Lens cache file (no '{_KEY}' metadata; was it saved by save_cache?)"
        )
    try:
        end = max((int(t["data_offsets"][1]) for t in table.values()), default=0)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ValueError(f"{path}: not a safetensors file (bad tensor table: {e!r})") from e
    if end != size - 8 - n:
        raise ValueError(
            f"{path}: truncated or padded: arrays need {end} data bytes, the file holds {size - 8 - n}"
        )
    try:
        header = json.loads(meta[_KEY])
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: corrupt KV Lens metadata ({e})") from e
    except RecursionError:
        raise ValueError(f"{path}: corrupt KV Lens metadata (JSON nested too deeply)") from None
    if not isinstance(header, dict) or header.get("format") != fmt:
        found = header.get("format") if isinstance(header, dict) else header
        raise ValueError(f"{path}: format {found!r}, expected {fmt!r}")
    if header.get("version") != version:
        raise ValueError(
            f"{path}: format version {header.get('version')!r}; this KV Lens reads version {version}"
        )
    return header


def _build(info: Any, arrays: dict[str, mx.array], where: str) -> Any:
    """One layer from its checked fields (kvcore.cache.file_checks): nonsense is refused before any object exists."""
    cache_checks.check_header_layer(info, where)
    cls = _CLASSES.get(info.get("class"))
    if cls is KiviKVCache:
        return _build_kivi(info, arrays, where)
    if cls is None:
        raise ValueError(f"{where}: unknown cache class {info.get('class')!r}; allowed {sorted(_CLASSES)}")
    quantized = cls in (QuantizedKVCache, SparseQuantizedKVCache)
    if quantized and "bits" not in info:
        raise ValueError(f"{where}: a {cls.__name__} needs bits and group_size")
    quant = info.get("quant", DEFAULT_QUANT)
    if quant != DEFAULT_QUANT and cls is not SparseQuantizedKVCache:
        raise ValueError(f"{where}: a {cls.__name__} is packed affine, not {quant!r}")
    if cls is SparseQuantizedKVCache:
        layer: Any = cls(
            group_size=info["group_size"], bits=info["bits"], value_bits=info.get("value_bits"), quant=quant
        )
    elif quantized:
        layer = cls(group_size=info["group_size"], bits=info["bits"])
    else:
        layer = cls()
    layer.offset = int(info["offset"])
    if info.get("empty"):
        if arrays:
            raise ValueError(f"{where}: an empty layer has arrays {sorted(arrays)}")
        return layer
    widths = (info["bits"], info.get("value_bits", info["bits"])) if quantized else (UNQUANTIZED_BITS,) * 2
    scheme = scheme_for(quant, info["group_size"]) if quantized else None
    n_packed = (scheme.n_parts, scheme.n_value_parts) if scheme is not None else (1, 1)
    k_parts, v_parts = (1 if w == UNQUANTIZED_BITS else n for w, n in zip(widths, n_packed, strict=True))
    try:
        k = tuple(arrays[f"keys.{j}"] for j in range(k_parts))
        v = tuple(arrays[f"values.{j}"] for j in range(v_parts))
    except KeyError as e:
        raise ValueError(f"{where}: missing array {e}") from e
    rows = cache_checks.check_rows(k, v, info, where)
    if not quantized:
        k, v = k[0], v[0]
    if cls in (SparseKVCache, SparseQuantizedKVCache):
        if "selection" not in arrays:
            raise ValueError(f"{where}: missing array 'selection'")
        cache_checks.check_selection(
            info, arrays["selection"], rows, layer.offset, int(arrays["keys.0"].shape[1]), where
        )
        counts = mx.array(np.asarray(info["prefix_counts"], dtype=np.int32))
        state: tuple = (k, v, arrays["selection"].astype(mx.int32), counts, layer.offset)
        if quantized:
            state = (*state, info["group_size"], info["bits"], info.get("value_bits", info["bits"]), quant)
        layer.state = state
    else:
        cache_checks.check_dense(rows, layer.offset, where)
        layer.keys, layer.values = k, v
    return layer


def _build_kivi(info: dict, arrays: dict[str, mx.array], where: str) -> KiviKVCache:
    """A KIVI layer: its residual built as a sparse layer, then its body's parts and positions checked against it."""
    scheme = cache_checks.check_kivi_header(info, where)
    res_fields = {k.removeprefix("residual."): v for k, v in arrays.items() if k.startswith("residual.")}
    residual = _build(info.get("residual"), res_fields, f"{where}: residual")
    if not isinstance(residual, SparseKVCache) or residual.keys is None:
        raise ValueError(f"{where}: a kivi layer's residual must be a non-empty SparseKVCache")
    bits, value_bits = info["bits"], info["value_bits"]
    parts = {
        "body_keys": 1 if bits == UNQUANTIZED_BITS else 3,
        "body_values": 1 if value_bits == UNQUANTIZED_BITS else 3,
    }
    n_body = info["n_body"]
    wanted = (
        {f"{side}.{j}" for side, n in parts.items() for j in range(n)} | {"body_positions"}
        if n_body
        else set()
    )
    body = {k: v for k, v in arrays.items() if not k.startswith("residual.")}
    if set(body) != wanted:
        raise ValueError(f"{where}: body arrays {sorted(body)}, expected {sorted(wanted)}")
    layer = KiviKVCache(scheme, bits, value_bits)
    layer.residual = residual
    if n_body:
        keys = tuple(body[f"body_keys.{j}"] for j in range(parts["body_keys"]))
        values = tuple(body[f"body_values.{j}"] for j in range(parts["body_values"]))
        positions = cache_checks.check_kivi_body(keys, values, body["body_positions"], info, residual, where)
        layer.body_keys, layer.body_values, layer.body_positions = keys, values, positions
    return layer


def read_file(path: Path, fmt: str = FORMAT, version: int = VERSION) -> tuple[dict, dict[str, mx.array]]:
    """(header, arrays) of a file `write_file` wrote, after the completeness, format and digest checks."""
    if not path.is_file():
        raise ValueError(f"{path}: not a regular file" if path.exists() else f"{path}: no such file")
    header = _read_header(path, fmt, version)
    try:
        arrays = mx.load(str(path), format="safetensors")
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the arrays ({e})") from e
    expected = header.pop("sha256", None)
    if expected is None or _digest(header, arrays) != expected:
        raise ValueError(
            f"{path}: SHA-256 digest mismatch: the file was modified or damaged after it was saved"
        )
    return header, arrays


def build_layers(layers: Any, arrays: dict[str, mx.array], where: str, prefix: str = "") -> list:
    """The cache `layer_arrays` saved, each layer's fields checked (kvcore.cache.file_checks) before it is built."""
    if not isinstance(layers, list):
        raise ValueError(f"{where}: 'layers' must be a list, got {type(layers).__name__}")
    cache = []
    try:
        for i, info in enumerate(layers):
            own = f"{prefix}{i}."
            fields = {k[len(own) :]: v for k, v in arrays.items() if k.startswith(own)}
            cache.append(_build(info, fields, f"{where}: layer {i}"))
    except (KeyError, TypeError) as e:
        raise ValueError(f"{where}: inconsistent KV Lens metadata ({e!r})") from e
    return cache


def load_cache(path: str | os.PathLike) -> tuple[list, dict]:
    """Read a file written by `save_cache`: (cache, metadata). ValueError names the file and what is wrong."""
    path = Path(path)
    header, arrays = read_file(path)
    return build_layers(header.get("layers"), arrays, str(path)), header.get("metadata", {})
