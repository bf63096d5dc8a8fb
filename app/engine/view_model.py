"""Plain data the engine thread hands to the GUI: everything a widget shows, already NumPy/Python.

Qt-free and MLX-free on purpose: building these happens inside a job (on the engine thread), reading them
happens on the GUI thread, so nothing in here may hold an MLX array or a Session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.engine.stored_view import ChannelView, channel_view, merge_rows
from kvcore.engine.session import CompressedState, Regeneration, Session
from kvcore.methods.selection import final_scores
from kvcore.model.loading import ModelInfo


@dataclass(frozen=True)
class LoadedModel:
    """What the window needs to know after a load."""

    spec: str
    info: ModelInfo


@dataclass(frozen=True)
class SequenceView:
    """The prompt tokens followed by the dense continuation, as text, for the session panel."""

    tokens: list[str]
    prompt_len: int
    prefill_ms: float | None = None
    cut_short: bool = False  # a Generate N cancelled part way: the tokens generated until then are kept


@dataclass(frozen=True)
class TokenSteps:
    """Per generated token i, teacher-forced on the dense continuation: both caches predict dense token i
    from the same history. Top-k lists are by descending probability."""

    tokens: list[str]  # the dense tokens, one per column
    kl: np.ndarray  # [n] KL(dense ‖ compressed) of the next-token distributions
    agreement: np.ndarray  # [n] bool: the compressed cache's top-1 is the dense token
    dense_top_ids: np.ndarray  # [n, k]
    dense_top_probs: np.ndarray  # [n, k]
    dense_top_texts: list[list[str]]
    compressed_top_ids: np.ndarray  # [n, k]
    compressed_top_probs: np.ndarray  # [n, k]
    compressed_top_texts: list[list[str]]
    first_divergence: int | None  # of the free-running compressed continuation
    first_compared: int = 0  # tokens before it come from the dense prefill ("paper") and cannot differ


@dataclass
class CompressionView:
    """One compression result ready to draw. Columns are sequence positions: the T prompt positions the
    config's schedule compresses, then what is always stored (under "mlx-lm" the last prompt token) and the dense
    continuation."""

    config: dict[str, Any]
    n_layers: int
    n_kv_heads: int
    n_prompt_positions: int
    kept: np.ndarray  # [L*H_kv, columns] bool
    row_labels: list[str]
    token_texts: list[str]
    scores: np.ndarray | None  # [L*H_kv, columns] float32, NaN where there is no score
    quant_error: np.ndarray | None  # [L*H_kv, columns] float32, NaN where nothing was quantized
    stats_rows: list[dict[str, Any]]
    metrics: dict[str, Any]
    sequence: SequenceView
    dense_texts: list[str]
    compressed_texts: list[str] | None  # None when not regenerated
    first_divergence: int | None
    not_compressible: list[int] = field(default_factory=list)
    not_compressible_labels: dict[int, str] = field(default_factory=dict)  # e.g. "sliding window 32: not …"
    request_id: int = 0
    token_steps: TokenSteps | None = None  # per generated token; None when not regenerated
    budget_note: str | None = None  # why the budget rule fell back to uniform counts (pyramidkv), else None
    key_channels: ChannelView | None = None  # think's stored key channels; None when none were pruned
    merge_targets: np.ndarray | None = None  # [L*H_kv, T] merging's target per evicted position, −1 none


def rows_of(per_layer: np.ndarray) -> np.ndarray:
    """[L, H_kv, T] -> [L*H_kv, T], row r = layer r // H_kv, kv-head r % H_kv (the heatmap's row order)."""
    n_layers, n_heads, length = per_layer.shape
    return per_layer.reshape(n_layers * n_heads, length)


def sequence_view(session: Session) -> SequenceView:
    """Prompt plus dense continuation as token texts."""
    ids = [*session.prompt_ids, *session.dense_tokens]
    return SequenceView(session.token_texts(ids), len(session.prompt_ids), session.prefill_ms)


def _padded(rows: np.ndarray, extra: int, fill: float | bool) -> np.ndarray:
    pad = np.full((rows.shape[0], extra), fill, dtype=rows.dtype)
    return np.concatenate([rows, pad], axis=1)


def _scores(state: CompressedState, n_heads: int) -> np.ndarray | None:
    layers = state.ranking.layers
    if all(layer is None for layer in layers):
        return None
    length = state.kept.shape[2]
    out = np.full((len(layers), n_heads, length), np.nan, dtype=np.float32)
    for i, scores in enumerate(final_scores(state.ranking, state.config.ratio)):
        if scores is not None:  # a wrapper's final ranking (chunk means), not its inner method's scores
            out[i] = scores
    return out


def _texts(session: Session, ids: np.ndarray) -> list[list[str]]:
    flat = session.token_texts(ids.ravel().tolist())
    k = ids.shape[1] if ids.ndim == 2 else 0
    return [flat[i * k : (i + 1) * k] for i in range(ids.shape[0])]


def token_steps(session: Session, regen: Regeneration) -> TokenSteps | None:
    """The per-token strip's data: regenerate's per-step metrics with every id turned into its text."""
    steps = regen.steps
    if steps is None:
        return None
    n = len(steps.kl)
    return TokenSteps(
        tokens=session.token_texts(session.dense_tokens[:n]),
        kl=np.asarray(steps.kl, dtype=np.float64),
        agreement=np.asarray(steps.agreement, dtype=bool),
        dense_top_ids=np.asarray(steps.dense_top_ids),
        dense_top_probs=np.asarray(steps.dense_top_probs, dtype=np.float64),
        dense_top_texts=_texts(session, np.asarray(steps.dense_top_ids)),
        compressed_top_ids=np.asarray(steps.compressed_top_ids),
        compressed_top_probs=np.asarray(steps.compressed_top_probs, dtype=np.float64),
        compressed_top_texts=_texts(session, np.asarray(steps.compressed_top_ids)),
        first_divergence=regen.metrics.get("first_divergence"),
        first_compared=int(regen.metrics.get("first_compressed_step", 0)),
    )


def compression_view(session: Session, state: CompressedState, regen: Regeneration | None) -> CompressionView:
    """Turn a compressed state (and its regeneration, if any) into widget data."""
    n_layers, n_heads, _ = state.kept.shape
    sequence = sequence_view(session)
    extra = len(sequence.tokens) - state.kept.shape[2]
    not_compressible = sorted(
        set(state.not_compressible) | {i for i, layer in enumerate(state.ranking.layers) if layer is None}
    )
    labels = [
        f"L{layer} h{head}" + (" ✕" if layer in not_compressible else "")
        for layer in range(n_layers)
        for head in range(n_heads)
    ]
    scores = _scores(state, n_heads)
    quant = state.quant_error
    metrics: dict[str, Any] = {
        "bytes_dense": state.bytes_dense,
        "bytes_compressed": state.bytes_compressed,
        "compression_ratio": state.bytes_compressed / state.bytes_dense if state.bytes_dense else None,
        "bytes_not_compressible": state.bytes_not_compressible,
        "compressible_ratio": state.compressible_ratio,
        "recompress_ms": state.recompress_ms,
    }
    if regen is not None:
        metrics = {k: v for k, v in regen.metrics.items() if k != "kl_per_step"}
    return CompressionView(
        config=state.config.to_dict(),
        n_layers=n_layers,
        n_kv_heads=n_heads,
        n_prompt_positions=state.kept.shape[2],
        kept=_padded(rows_of(state.kept), extra, True),
        row_labels=labels,
        token_texts=sequence.tokens,
        scores=None if scores is None else _padded(rows_of(scores), extra, np.nan),
        quant_error=None if quant is None else _padded(rows_of(quant.astype(np.float32)), extra, np.nan),
        stats_rows=[dict(r) for r in state.stats_rows],
        metrics=metrics,
        sequence=sequence,
        dense_texts=session.token_texts(session.dense_tokens),
        compressed_texts=None if regen is None else session.token_texts(regen.tokens),
        first_divergence=None if regen is None else regen.metrics.get("first_divergence"),
        not_compressible=not_compressible,
        not_compressible_labels=dict(state.not_compressible),
        token_steps=None if regen is None else token_steps(session, regen),
        budget_note=state.budget_note,
        key_channels=channel_view(state, session.info.head_dim),
        merge_targets=merge_rows(state),
    )
