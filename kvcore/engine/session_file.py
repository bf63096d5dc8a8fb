"""Session files (`.kvlens`): a prefilled session saved so that opening it later needs no forward pass.

One safetensors file (never pickle) written through `kvcore.cache.files` (atomic, SHA-256 sealed): the dense
prefilled cache, the dense decode cache, the captured observations of both schedules (window queries, h2o
sums computed now if they were deferred, expected_attention's query statistics and mean future rotation), the
prefill's last-position logits, the dense continuation and its reference logits; the JSON header holds the model
reference and fingerprint, prompt ids and text, the chat template choice and whatever the caller adds (`extra`:
the app's current and pinned configuration, sweep results). Opening checks the model fingerprint and every
field, and refuses a bad file with a message naming the part; the session is changed only once everything has
been read and checked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from kvcore.cache import files as cache_io
from kvcore.capture.prefill import (
    CaptureResult,
    LayerObservation,
    _observe_keys,
    _trimmed,
    attach_output_projections,
)
from kvcore.capture.query_stats import QueryStats
from kvcore.defaults import CAPTURE_WINDOW, QUERY_STATS_HEAD, SCHEDULES
from kvcore.engine.session import Session
from kvcore.model.fingerprint import model_fingerprint

FORMAT = "kvlens-session"
VERSION = 1
SUFFIX = ".kvlens"
_OBS = {"paper": "obs.full.", "mlx-lm": "obs.before."}
_EXTRA = "extra."


def _observation_arrays(capture: CaptureResult, prefix: str) -> tuple[dict[str, mx.array], list]:
    arrays, meta = {}, []
    for i, obs in enumerate(capture.observations):
        if obs is None:
            meta.append(None)
            continue
        arrays[f"{prefix}{i}.window_queries"] = obs.window_queries
        arrays[f"{prefix}{i}.h2o_sums"] = obs.ensure_h2o()
        layer = {"n_q_heads": obs.n_q_heads, "n_kv_heads": obs.n_kv_heads, "scale": obs.scale}
        stats = obs.query_stats
        if stats is not None and stats.mean_rotation() is not None:  # expected_attention's statistics
            arrays[f"{prefix}{i}.query_head"] = stats.head
            arrays[f"{prefix}{i}.query_rotation"] = stats.rotation
            if stats.count:
                arrays[f"{prefix}{i}.query_mean"], arrays[f"{prefix}{i}.query_m2"] = stats.mean, stats.m2
            layer["query_count"] = stats.count
        meta.append(layer)
    return arrays, meta


def save_session(
    path: str | os.PathLike,
    session: Session,
    extra: dict | None = None,
    extra_arrays: dict[str, np.ndarray] | None = None,
) -> None:
    """Write the session's prefill to `path` atomically; `extra` (JSON) and `extra_arrays` (the caller's view,
    NumPy) come back from `open_session`."""
    path = Path(path)
    capture = session._capture
    if capture is None or session._dense_decode_cache is None:
        raise ValueError("nothing to save: prefill a prompt first")
    if capture.before_last is None or any(type(c) is not KVCache for c in capture.cache):
        raise ValueError(
            f"{path}: only models whose every layer is a plain KV cache can be saved as a session"
        )
    arrays, layers = cache_io.layer_arrays(capture.cache, path, "cache.")
    decode, decode_layers = cache_io.layer_arrays(session._dense_decode_cache, path, "decode.")
    arrays.update(decode)
    observations = {}
    for schedule in SCHEDULES:
        obs_arrays, observations[schedule] = _observation_arrays(session._observed(schedule), _OBS[schedule])
        arrays.update(obs_arrays)
        arrays[f"reference.{schedule}"] = mx.array(session.dense_reference(schedule))
    arrays["logits.full"] = capture.logits
    arrays.update({f"{_EXTRA}{k}": mx.array(v) for k, v in (extra_arrays or {}).items()})
    arrays["logits.before"] = capture.before_last.logits
    info = session.info
    header = {
        "format": FORMAT,
        "version": VERSION,
        "model": {"spec": info.path, "name": info.name, "fingerprint": model_fingerprint(info.path)},
        "prompt_ids": list(session.prompt_ids),
        "prompt_text": session.tokenizer.decode(session.prompt_ids),
        "chat_template_applied": session.chat_template_applied,
        "dense_tokens": list(session.dense_tokens),
        # informational: a continuation past the trained context (--beyond-context); opening derives it again
        "beyond_context": session.beyond_context,
        "prefill_ms": session.prefill_ms,
        "cache_layers": layers,
        "decode_layers": decode_layers,
        "observations": observations,
        "skipped": {str(k): v for k, v in capture.skipped.items()},
        "extra": extra or {},
    }
    cache_io.write_file(path, arrays, header)


def read_contents(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, mx.array]]:
    """(header, arrays) of a session file, read once and checked complete and sealed (its SHA-256), so every
    later check looks at the bytes that will be used."""
    return cache_io.read_file(Path(path), FORMAT, VERSION)


def saved_model(header: dict[str, Any], path: str | os.PathLike) -> dict[str, Any]:
    """The model reference of a read header: spec, name and fingerprint, each a string."""
    model = header.get("model")
    if not isinstance(model, dict) or not all(
        isinstance(model.get(k), str) and model[k] for k in ("spec", "name", "fingerprint")
    ):
        raise ValueError(f"{path}: model: expected the model's spec, name and fingerprint as text")
    return model


def read_model(path: str | os.PathLike) -> dict[str, Any]:
    """The model reference of a session file (spec, name, fingerprint), to load the model before opening."""
    return saved_model(read_contents(path)[0], path)


def model_folder(path: str | os.PathLike, header: dict[str, Any] | None = None) -> str:
    """The local folder of the model a session file names, checked against the saved fingerprint before
    anything loads it. A session file never downloads: a hub id, or a folder that is gone or holds another
    model, is refused with the fix (load the model first)."""
    header = read_contents(path)[0] if header is None else header
    model = saved_model(header, path)
    spec, name = model["spec"], model["name"]
    folder = Path(spec).expanduser()
    if not (folder / "config.json").is_file():
        raise ValueError(
            f"{path}: model: saved with {name!r} from {spec!r}, which is not a model folder on this computer; "
            "a session file never downloads a model: load that model (File ▸ Open model folder…, or --model) "
            "and open the session again"
        )
    found = model_fingerprint(folder)
    if found != model["fingerprint"]:
        raise ValueError(
            f"{path}: model: saved with {name!r} (fingerprint {model['fingerprint'][:16]}), but {folder} now "
            f"holds another model (fingerprint {found[:16]}): load the model the session was saved with first"
        )
    return str(folder)


def extra_arrays(arrays: dict[str, mx.array]) -> dict[str, np.ndarray]:
    """The caller's arrays (`extra_arrays` of save_session) among a file's arrays, as NumPy."""
    return {k[len(_EXTRA) :]: np.array(v) for k, v in arrays.items() if k.startswith(_EXTRA)}


def _ints(value: Any, n_min: int, limit: int | None, part: str, where: Path) -> list[int]:
    ok = isinstance(value, list) and len(value) >= n_min
    ok = ok and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    if not ok or (limit is not None and any(t >= limit for t in value)):
        bound = f" below the vocabulary size {limit}" if limit else ""
        raise ValueError(f"{where}: {part}: expected at least {n_min} token ids >= 0{bound}")
    return value


def _array(arrays: dict, name: str, shape: tuple[int, ...], part: str, where: Path) -> mx.array:
    x = arrays.get(name)
    if x is None:
        raise ValueError(f"{where}: {part}: missing array {name!r}")
    if tuple(x.shape) != shape or x.dtype not in (mx.float16, mx.bfloat16, mx.float32):
        raise ValueError(
            f"{where}: {part}: {name} is {x.dtype}{list(x.shape)}, expected a float array {list(shape)}"
        )
    if not bool(mx.all(mx.isfinite(x)).item()):
        raise ValueError(f"{where}: {part}: {name} holds NaN or infinite values")
    return x


def _layers(header: dict, key: str, arrays: dict, offset: int, info: Any, where: Path) -> list:
    cache = cache_io.build_layers(header.get(key), arrays, f"{where}: {key}", key.split("_")[0] + ".")
    if len(cache) != info.n_layers:
        raise ValueError(f"{where}: {key}: {len(cache)} layers, the model has {info.n_layers}")
    for i, layer in enumerate(cache):
        if type(layer) is not KVCache or layer.keys is None:
            raise ValueError(f"{where}: {key}: layer {i} must be a non-empty KVCache")
        for side, array, dim in (
            ("keys", layer.keys, info.head_dim),
            ("values", layer.values, info.value_dim),
        ):
            shape = tuple(array.shape)
            if layer.offset != offset or shape[1] != info.n_kv_heads or shape[3] != dim:
                raise ValueError(
                    f"{where}: {key}: layer {i} holds {side} {shape} at offset {layer.offset}, expected "
                    f"[1, {info.n_kv_heads}, {offset}, {dim}]"
                )
            if not bool(mx.all(mx.isfinite(array[..., :offset, :])).item()):
                raise ValueError(f"{where}: {key}: layer {i} {side} hold NaN or infinite values")
    return cache


def _observations(header: dict, arrays: dict, schedule: str, n: int, info: Any, where: Path) -> list:
    part = f"observations ({schedule})"
    meta = (
        (header.get("observations") or {}).get(schedule)
        if isinstance(header.get("observations"), dict)
        else None
    )
    if not isinstance(meta, list) or len(meta) != info.n_layers:
        raise ValueError(f"{where}: {part}: expected a list of {info.n_layers} layers")
    out: list[LayerObservation | None] = []
    for i, m in enumerate(meta):
        if m is None:
            out.append(None)
            continue
        heads = (info.n_q_heads, info.n_kv_heads)
        scale = m.get("scale") if isinstance(m, dict) else None
        if not isinstance(m, dict) or (m.get("n_q_heads"), m.get("n_kv_heads")) != heads:
            raise ValueError(f"{where}: {part}: layer {i} heads must be {heads}")
        if not isinstance(scale, float) or not scale > 0:
            raise ValueError(f"{where}: {part}: layer {i} scale must be a positive number, got {scale!r}")
        prefix = f"{_OBS[schedule]}{i}."
        w = min(CAPTURE_WINDOW, n)
        queries = _array(arrays, prefix + "window_queries", (info.n_q_heads, w, info.query_dim), part, where)
        sums = _array(arrays, prefix + "h2o_sums", (info.n_q_heads, n), part, where)
        latent = bool(info.latent_rope_dim)
        obs = LayerObservation(mx.zeros((0,)), queries, sums, *heads, scale, latent=latent)
        obs.query_stats = _query_stats(m, arrays, prefix, n, info, f"{part}: layer {i}", where)
        out.append(obs)
    return out


def _query_stats(
    m: dict, arrays: dict, prefix: str, n: int, info: Any, part: str, where: Path
) -> QueryStats | None:
    """expected_attention's saved statistics of one layer (None if it had none), shapes checked."""
    if "query_count" not in m:
        return None
    head = min(QUERY_STATS_HEAD, n)
    count = m["query_count"]
    if not isinstance(count, int) or isinstance(count, bool) or count != n - head:
        raise ValueError(f"{where}: {part}: query_count must be {n - head} for {n} tokens, got {count!r}")
    h, d = info.n_q_heads, info.head_dim
    rows = _array(arrays, prefix + "query_head", (h, head, d), part, where)
    rotation = _array(arrays, prefix + "query_rotation", (d, d), part, where)
    mean = _array(arrays, prefix + "query_mean", (h, d), part, where) if count else None
    m2 = _array(arrays, prefix + "query_m2", (h, d, d), part, where) if count else None
    return QueryStats(rows, count, mean, m2, rotation=rotation)


def open_session(
    path: str | os.PathLike,
    session: Session,
    contents: tuple[dict[str, Any], dict[str, mx.array]] | None = None,
) -> tuple[dict, dict[str, np.ndarray]]:
    """Restore a file `save_session` wrote into `session` (its model must match); returns the saved `extra`
    and `extra_arrays` (the caller checks what they mean). `contents` is what `read_contents` read, when the
    caller has checked it already; otherwise the file is read now.

    Every field is checked first; on any error (ValueError naming the part) the session is left as it was."""
    path = Path(path)
    header, arrays = read_contents(path) if contents is None else contents
    info = session.info
    model = header.get("model") if isinstance(header.get("model"), dict) else {}
    saved, loaded = model.get("fingerprint"), model_fingerprint(info.path)
    if saved != loaded:
        raise ValueError(
            f"{path}: model: saved with {model.get('name')!r} (fingerprint {str(saved)[:16]}), "
            f"the loaded model is {info.name!r} (fingerprint {loaded[:16]}): load that model first"
        )
    vocab = info.vocab_size
    ids = _ints(header.get("prompt_ids"), 2, vocab, "prompt_ids", path)
    dense = _ints(header.get("dense_tokens"), 1, vocab, "dense_tokens", path)
    applied, prefill_ms, extra = (
        header.get("chat_template_applied"),
        header.get("prefill_ms"),
        header.get("extra"),
    )
    if (
        not isinstance(applied, bool)
        or not isinstance(prefill_ms, int | float)
        or not isinstance(extra, dict)
    ):
        raise ValueError(f"{path}: header: chat_template_applied, prefill_ms or extra has the wrong type")
    skipped = header.get("skipped")
    if not isinstance(skipped, dict) or not all(
        k.isdigit() and isinstance(v, str) for k, v in skipped.items()
    ):
        raise ValueError(f"{path}: skipped: expected an object of layer -> reason")
    T = len(ids)
    cache = _layers(header, "cache_layers", arrays, T, info, path)
    decode = _layers(header, "decode_layers", arrays, T + len(dense) - 1, info, path)
    full_logits = arrays.get("logits.full")
    if full_logits is not None and full_logits.ndim != 1:
        raise ValueError(
            f"{path}: logits: logits.full has {full_logits.ndim} dimensions {list(full_logits.shape)}, expected 1 "
            "(one logit per vocabulary entry); the file was edited: save it again"
        )
    V = int(full_logits.shape[0]) if full_logits is not None else 0
    logits = _array(arrays, "logits.full", (V,), "logits", path)
    logits_before = _array(arrays, "logits.before", (V,), "logits", path)
    if vocab is not None and vocab != V:
        raise ValueError(f"{path}: logits: {V} entries, the model's vocabulary has {vocab}")
    references = {
        s: np.array(
            _array(arrays, f"reference.{s}", (len(dense), V), "reference logits", path).astype(mx.float32)
        )
        for s in SCHEDULES
    }
    full = CaptureResult(cache, _observations(header, arrays, "paper", T, info, path), {}, logits, 0, T)
    before = CaptureResult(
        [_trimmed(c, T - 1) for c in cache],
        _observations(header, arrays, "mlx-lm", T - 1, info, path),
        {},
        logits_before,
        0,
        T - 1,
    )
    _observe_keys(full, full.cache)
    _observe_keys(before, before.cache)
    attach_output_projections(
        session.model, [full, before]
    )  # criticalkv's ‖W_o·v‖ reads them, as after a prefill
    full.before_last = before
    full.skipped = before.skipped = {int(k): v for k, v in skipped.items()}
    own = extra_arrays(arrays)
    session.restore_prefill(full, ids, applied, dense, references, decode, float(prefill_ms))
    return extra, own
