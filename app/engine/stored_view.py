"""What a method that changes the stored rows did, as plain arrays for the views: ThinK's kept key channels per
(layer, kv-head) and the bytes they save, merging's target of every evicted position.

Built on the engine thread from a CompressedState (the MLX arrays become NumPy here), read on the GUI thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcore.engine.session import CompressedState, Session


@dataclass(frozen=True)
class ChannelView:
    """ThinK's stored key channels. Rows are the heatmap's (layer-major, then kv-head); a layer whose keys are
    stored whole (not pruned, or not compressible) has every channel kept and `pruned_layers` leaves it out."""

    kept: np.ndarray  # [L*H_kv, head_dim] bool: channel c of the head's keys is stored
    rows_stored: np.ndarray  # [L*H_kv] int: prompt rows stored with narrow keys
    bytes_saved: np.ndarray  # [L*H_kv] int: pruned channels × rows × the key's element size
    pruned_layers: list[int]

    @property
    def head_dim(self) -> int:
        return int(self.kept.shape[1])


def channel_view(state: CompressedState, head_dim: int) -> ChannelView | None:
    """The kept-channel map of a state whose method pruned key channels (think); None when no layer was."""
    channels = Session.kept_channels(state)
    if all(c is None for c in channels):
        return None
    n_layers, n_heads = state.kept.shape[:2]
    kept = np.ones((n_layers, n_heads, head_dim), dtype=bool)
    rows = np.zeros((n_layers, n_heads), dtype=np.int64)
    saved = np.zeros((n_layers, n_heads), dtype=np.int64)
    for layer, (chosen, stored) in enumerate(zip(channels, state.cache, strict=True)):
        if chosen is None:
            continue
        kept[layer] = False
        np.put_along_axis(kept[layer], chosen.astype(np.int64), True, axis=1)
        rows[layer] = np.asarray(stored.body.kept_counts)
        saved[layer] = (head_dim - chosen.shape[1]) * rows[layer] * _key_itemsize(stored.body)
    return ChannelView(
        kept=kept.reshape(n_layers * n_heads, head_dim),
        rows_stored=rows.ravel(),
        bytes_saved=saved.ravel(),
        pruned_layers=[i for i, c in enumerate(channels) if c is not None],
    )


def _key_itemsize(layer: Any) -> int:
    keys, _ = layer.keys_and_values()
    return int(keys.dtype.size)


def merge_rows(state: CompressedState) -> np.ndarray | None:
    """[L*H_kv, T] the kept position each evicted position's value was merged into (merging), −1 where it is
    kept, was not merged or its layer merged nothing; None when no layer merged."""
    targets = Session.merge_targets(state)
    if all(t is None for t in targets):
        return None
    n_layers, n_heads, length = state.kept.shape
    out = np.full((n_layers, n_heads, length), -1, dtype=np.int32)  # 33 MB at 32 × 8 heads × 32k
    for layer, into in enumerate(targets):
        if into is not None:
            out[layer, :, : min(length, into.shape[1])] = np.asarray(into)[:, :length]
    return out.reshape(n_layers * n_heads, length)
