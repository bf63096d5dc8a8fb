"""Every field of a CompressionView read back from a session file, by type and range.

A session file is sealed, but anyone can re-seal it: the seal proves the file is whole, not that its fields make
sense. So before a saved view replaces anything on screen each field is checked here — a list of text where the
widgets want text, a bool mask of the right shape, a number where a metric is drawn — and a forged one is refused
with "view: <field> must be …", so nothing that reaches a widget can make it throw.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from app.engine.stored_view import ChannelView
from app.engine.view_model import CompressionView, SequenceView, TokenSteps
from kvcore.defaults import SCHEDULES
from kvcore.engine.session import CompressionConfig

#: Metrics that count tokens or steps: whole numbers >= 0 (first_divergence may also be None: no divergence).
_COUNTS = ("first_divergence", "first_compressed_step", "compared_tokens")


def is_int(value: Any) -> bool:
    """A JSON whole number (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A JSON number that is finite or NaN (NaN means "no value"; an infinity is never written)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (math.isnan(value) or math.isfinite(value))
    )


def is_scalar(value: Any) -> bool:
    """A table cell: text, a bool, a number or None."""
    return value is None or isinstance(value, str | bool) or is_number(value)


def require(ok: bool, part: str, expected: str) -> None:
    if not ok:
        raise ValueError(f"{part} must be {expected}")


def check_int(value: Any, part: str, low: int, high: int) -> int:
    require(is_int(value) and low <= value <= high, part, f"a whole number in [{low}, {high}], not {value!r}")
    return value


def check_texts(value: Any, part: str, n: int | None = None) -> list[str]:
    ok = isinstance(value, list) and all(isinstance(t, str) for t in value)
    require(
        ok and (n is None or len(value) == n),
        part,
        "a list of texts" if n is None else f"a list of {n} texts",
    )
    return value


def check_array(value: Any, part: str, shape: tuple[int, ...], kind: str) -> np.ndarray:
    """An array of `shape` whose dtype kind is `kind` ('b' bool, 'f' float: finite or NaN, 'i' ids >= 0)."""
    ok = isinstance(value, np.ndarray) and value.shape == shape
    if ok and kind == "i":
        ok = value.dtype.kind in "iu" and bool(np.all(value >= 0))
    elif ok:
        ok = value.dtype.kind == kind and (kind != "f" or not bool(np.any(np.isinf(value))))
    names = {"b": "bool", "f": "float (finite or NaN)", "i": "token-id"}
    require(ok, part, f"a {names[kind]} array of shape {list(shape)}")
    return value


def check_config(value: Any, part: str) -> dict[str, Any]:
    """A compression setting the controls and the engine accept (CompressionConfig builds it)."""
    require(isinstance(value, dict) and all(isinstance(k, str) for k in value), part, "an object")
    require(
        "per_head" not in value or isinstance(value["per_head"], bool), f"{part}.per_head", "true or false"
    )
    require("params" not in value or isinstance(value["params"], dict), f"{part}.params", "an object")
    try:
        CompressionConfig.from_dict(value)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        text = str(e)  # a list of every method can be long: the dialog keeps room for the fix
        raise ValueError(f"{part}: {text if len(text) <= 120 else text[:119] + '…'}") from None
    return value


def check_cells(value: Any, part: str) -> dict[str, Any]:
    ok = isinstance(value, dict) and all(isinstance(k, str) and is_scalar(v) for k, v in value.items())
    require(ok, part, "an object of text, numbers, bools or null")
    return value


def _check_metrics(metrics: Any) -> None:
    require(
        isinstance(metrics, dict) and all(isinstance(k, str) for k in metrics), "view: metrics", "an object"
    )
    for key, value in metrics.items():
        part = f"view: metrics.{key}"
        if key == "schedule":
            require(value in SCHEDULES, part, f"one of {', '.join(SCHEDULES)}")
        elif key in _COUNTS:
            require(
                value is None or (is_int(value) and value >= 0), part, f"a whole number >= 0, not {value!r}"
            )
        else:
            require(value is None or is_number(value), part, f"a number, not {value!r}")


def _check_steps(steps: TokenSteps, n_dense: int) -> None:
    part = "view: token_steps"
    n = len(steps.tokens) if isinstance(steps.tokens, list) else -1
    require(0 <= n <= n_dense, f"{part}.tokens", f"a list of at most {n_dense} texts")
    check_texts(steps.tokens, f"{part}.tokens", n)
    check_array(steps.kl, f"{part}.kl", (n,), "f")
    check_array(steps.agreement, f"{part}.agreement", (n,), "b")
    ids = steps.dense_top_ids
    k = ids.shape[1] if isinstance(ids, np.ndarray) and ids.ndim == 2 else -1
    for side in ("dense", "compressed"):
        check_array(getattr(steps, f"{side}_top_ids"), f"{part}.{side}_top_ids", (n, k), "i")
        check_array(getattr(steps, f"{side}_top_probs"), f"{part}.{side}_top_probs", (n, k), "f")
        texts = getattr(steps, f"{side}_top_texts")
        require(
            isinstance(texts, list) and len(texts) == n, f"{part}.{side}_top_texts", f"{n} lists of texts"
        )
        for row in texts:
            check_texts(row, f"{part}.{side}_top_texts", k)
    require(
        steps.first_divergence is None
        or (is_int(steps.first_divergence) and 0 <= steps.first_divergence <= n),
        f"{part}.first_divergence",
        f"null or a whole number in [0, {n}]",
    )
    check_int(steps.first_compared, f"{part}.first_compared", 0, n)


def _check_channels(channels: Any, rows: int, n_layers: int) -> None:
    """ThinK's kept-channel map: a bool [rows, head_dim] mask, counts and bytes >= 0 per row, distinct layers."""
    part = "view: key_channels"
    require(isinstance(channels, ChannelView), part, "an object")
    kept = channels.kept
    dim = kept.shape[1] if isinstance(kept, np.ndarray) and kept.ndim == 2 else -1
    require(1 <= dim <= 1 << 16, f"{part}.kept", "a bool array [rows, head_dim]")
    check_array(kept, f"{part}.kept", (rows, dim), "b")
    for name in ("rows_stored", "bytes_saved"):
        value = getattr(channels, name)
        ok = isinstance(value, np.ndarray) and value.shape == (rows,) and value.dtype.kind in "iu"
        require(ok and bool(np.all(value >= 0)), f"{part}.{name}", f"a whole-number array [{rows}] >= 0")
    layers = channels.pruned_layers
    ok = isinstance(layers, list) and all(is_int(i) and 0 <= i < n_layers for i in layers)
    require(ok and len(set(layers)) == len(layers), f"{part}.pruned_layers", "a list of distinct layers")


def _check_merges(targets: Any, kept: np.ndarray, n_positions: int) -> None:
    """merging's targets: a whole-number [rows, n_prompt_positions] array, −1 or a position that row keeps."""
    part = "view: merge_targets"
    rows = kept.shape[0]
    ok = (
        isinstance(targets, np.ndarray)
        and targets.shape == (rows, n_positions)
        and targets.dtype.kind in "iu"
    )
    require(ok, part, f"a whole-number array of shape {[rows, n_positions]}")
    ok = bool(np.all((targets >= -1) & (targets < n_positions)))
    require(ok, part, f"-1 or a prompt position in [0, {n_positions})")
    r, c = np.nonzero(targets >= 0)
    require(bool(np.all(kept[r, targets[r, c]])), part, "the kept position each merged value went into")


def check_view(view: CompressionView) -> None:
    """Every field of a view read from a file, by type, range and against each other (not yet the model)."""
    check_config(view.config, "view: config")
    check_int(view.n_layers, "view: n_layers", 1, 1 << 16)
    check_int(view.n_kv_heads, "view: n_kv_heads", 1, 1 << 16)
    rows = view.n_layers * view.n_kv_heads
    columns = len(check_texts(view.token_texts, "view: token_texts"))  # one column per prompt or dense token
    require(columns > 0, "view: token_texts", "a list of at least one text")
    check_array(view.kept, "view: kept", (rows, columns), "b")
    check_int(view.n_prompt_positions, "view: n_prompt_positions", 1, columns)
    check_texts(view.row_labels, "view: row_labels", rows)
    for name in ("scores", "quant_error"):
        if getattr(view, name) is not None:
            check_array(getattr(view, name), f"view: {name}", (rows, columns), "f")
    stats = view.stats_rows
    require(isinstance(stats, list) and len(stats) == rows, "view: stats_rows", f"a list of {rows} rows")
    for row in stats:
        check_cells(row, "view: stats_rows[]")
    _check_metrics(view.metrics)
    sequence = view.sequence
    require(isinstance(sequence, SequenceView), "view: sequence", "an object")
    check_texts(sequence.tokens, "view: sequence.tokens", columns)
    prompt_len = check_int(sequence.prompt_len, "view: sequence.prompt_len", 1, columns)
    ms = sequence.prefill_ms
    require(ms is None or (is_number(ms) and ms >= 0), "view: sequence.prefill_ms", "null or a number >= 0")
    n_dense = columns - prompt_len
    check_texts(view.dense_texts, "view: dense_texts", n_dense)
    if view.compressed_texts is not None:
        check_texts(view.compressed_texts, "view: compressed_texts")
        require(len(view.compressed_texts) <= n_dense, "view: compressed_texts", f"at most {n_dense} texts")
    if view.first_divergence is not None:
        check_int(view.first_divergence, "view: first_divergence", 0, n_dense)
    nc = view.not_compressible
    ok = (
        isinstance(nc, list)
        and all(is_int(i) and 0 <= i < view.n_layers for i in nc)
        and len(set(nc)) == len(nc)
    )
    require(ok, "view: not_compressible", f"a list of distinct layers in [0, {view.n_layers})")
    labels = view.not_compressible_labels
    ok = isinstance(labels, dict) and all(
        str(k).isdigit() and int(k) < view.n_layers and isinstance(v, str) for k, v in labels.items()
    )
    require(ok, "view: not_compressible_labels", "an object of layer -> text")
    view.not_compressible_labels = {int(k): v for k, v in labels.items()}
    check_int(view.request_id, "view: request_id", 0, 1 << 62)
    if view.token_steps is not None:
        require(isinstance(view.token_steps, TokenSteps), "view: token_steps", "an object")
        _check_steps(view.token_steps, n_dense)
    require(
        view.budget_note is None or isinstance(view.budget_note, str), "view: budget_note", "null or text"
    )
    if view.key_channels is not None:
        _check_channels(view.key_channels, rows, view.n_layers)
    if view.merge_targets is not None:
        _check_merges(view.merge_targets, view.kept, view.n_prompt_positions)


def check_fits(
    view: CompressionView, n_layers: int, n_kv_heads: int, n_columns: int, prompt_len: int
) -> None:
    """The checked view against the restored session: its model's layers and kv-heads, its prompt and
    continuation (one column each), its schedule's prompt positions (all, or all but the last)."""
    if (view.n_layers, view.n_kv_heads) != (n_layers, n_kv_heads):
        raise ValueError(
            f"view: {view.n_layers} layers x {view.n_kv_heads} kv-heads, the model has {n_layers} x {n_kv_heads}"
        )
    if view.kept.shape[1] != n_columns or view.sequence.prompt_len != prompt_len:
        raise ValueError(
            f"view: kept mask {view.kept.shape} over a {view.sequence.prompt_len}-token prompt does not match the "
            f"session's {n_columns} columns and {prompt_len}-token prompt"
        )
    if not prompt_len - 1 <= view.n_prompt_positions <= prompt_len:
        raise ValueError(
            f"view: n_prompt_positions is {view.n_prompt_positions}, expected {prompt_len - 1} or {prompt_len}"
        )
