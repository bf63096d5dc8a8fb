"""Host-side form and checks of the indices `kvcore.cache.sparse.select_positions` takes, in NumPy.

The indices come from the host (kvcore.methods.selection builds them in NumPy), so shaping and checking them there costs no
device work and no read-back: one host→device copy then carries every layer's gather indices. The fast check is one
comparison pass per layer (strictly increasing rows), after which the range needs only each head's first and last
index; the full per-head flags are computed only on the error path, to name the first bad head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np


def _is_int_dtype(dtype: Any) -> bool:
    if isinstance(dtype, mx.Dtype):
        return mx.issubdtype(dtype, mx.integer)
    return np.issubdtype(dtype, np.integer)


def mx_arrays(indices_per_layer: Sequence[Any]) -> list[mx.array]:
    """Every mx array among the per-layer entries (evaluated together before they are read on the host)."""
    out = []
    for idx in indices_per_layer:
        items = idx if isinstance(idx, (list, tuple)) else [idx]
        out += [a for a in items if isinstance(a, mx.array)]
    return out


def _host(a: Any) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else np.asarray(a)


def host_indices(idx: Any, n_heads: int, where: str) -> tuple[np.ndarray, np.ndarray, bool]:
    """Indices of one layer -> (int32 rows: [n] when shared by all heads, else [H_kv, n] padded; counts; shared).

    Ragged heads are padded with 0 up to the longest head. Raises ValueError naming the layer (and head).
    """
    if isinstance(idx, (list, tuple)) and idx and not np.isscalar(idx[0]):
        if len(idx) != n_heads:
            raise ValueError(
                f"{where}: got {len(idx)} per-head index arrays, the layer has H_kv={n_heads} heads"
            )
        heads = []
        for h, a in enumerate(idx):
            a = a if isinstance(a, (mx.array, np.ndarray)) else np.asarray(a)
            if a.ndim != 1 or not _is_int_dtype(a.dtype):
                raise ValueError(
                    f"{where}, kv-head {h}: per-head indices must be 1-D integer arrays, "
                    f"got shape {tuple(a.shape)} dtype {a.dtype}"
                )
            if a.shape[0] == 0:
                raise ValueError(
                    f"{where}, kv-head {h}: empty selection; every kv-head must keep >= 1 position"
                )
            heads.append(a)
        counts = np.array([a.shape[0] for a in heads], dtype=np.int32)
        padded = np.zeros((n_heads, int(counts.max())), dtype=np.int32)
        for h, a in enumerate(heads):
            padded[h, : a.shape[0]] = _host(a)
        return padded, counts, False
    if not isinstance(idx, (mx.array, np.ndarray)):
        idx = np.asarray(idx)
    if not _is_int_dtype(idx.dtype):
        raise ValueError(f"{where}: indices must be integers, got dtype {idx.dtype}")
    if idx.ndim not in (1, 2):
        raise ValueError(
            f"{where}: indices of shape {tuple(idx.shape)}; allowed are 1-D [n] (shared by all heads), "
            f"2-D [H_kv={n_heads}, n] (per head), or a sequence of H_kv 1-D arrays (ragged)"
        )
    if idx.ndim == 2 and idx.shape[0] != n_heads:
        raise ValueError(f"{where}: 2-D indices have {idx.shape[0]} rows, the layer has H_kv={n_heads} heads")
    n = idx.shape[-1]
    if n == 0:
        raise ValueError(f"{where}: empty selection; keep at least one position")
    rows = _host(idx).astype(np.int32, copy=False)
    return rows, np.full(n_heads, n, dtype=np.int32), idx.ndim == 1


def check(rows: np.ndarray, counts: np.ndarray, limits: np.ndarray, where: str) -> None:
    """Raise ValueError unless each head's first counts[h] rows are strictly increasing and in [0, limits[h]).

    rows: [n] shared by every head, or [H_kv, n] padded beyond counts[h].
    """
    grid = rows[None] if rows.ndim == 1 else rows
    n = grid.shape[1]
    rising = grid[:, 1:] > grid[:, :-1]
    if grid.shape[0] > 1 and np.any(counts != n):  # ragged: only pairs inside each head's count
        rising |= np.arange(n - 1)[None, :] >= (counts - 1)[:, None]
    last = grid[np.arange(grid.shape[0]), (counts - 1) if rows.ndim == 2 else n - 1]
    if (
        rising.all()
        and (grid[:, 0] >= 0).all()
        and (last < (limits if rows.ndim == 2 else limits.min())).all()
    ):
        return
    raise ValueError(_explain(_flags(grid, counts, limits), rows, counts, limits, where))


def _flags(grid: np.ndarray, counts: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """[3, H_kv] bool: out of range, duplicated, unsorted (the error path only)."""
    h, n = len(counts), grid.shape[1]
    grid = np.broadcast_to(grid, (h, n))
    valid = np.arange(n)[None, :] < counts[:, None]
    out_of_range = np.any(valid & ((grid < 0) | (grid >= limits[:, None])), axis=1)
    step = np.diff(grid.astype(np.int64), axis=1)
    pairs = valid[:, 1:]
    return np.stack([out_of_range, np.any(pairs & (step == 0), axis=1), np.any(pairs & (step < 0), axis=1)])


def _explain(flags: np.ndarray, rows: np.ndarray, counts: np.ndarray, limits: np.ndarray, where: str) -> str:
    """Error text for the first bad kv-head: out of range before duplicated before unsorted."""
    kind, head = (int(x[0]) for x in np.nonzero(flags))
    values = (rows if rows.ndim == 1 else rows[head])[: counts[head]]
    head_label = " (indices shared by every kv-head)" if rows.ndim == 1 else f", kv-head {head}"
    if kind == 0:
        bad = values[(values < 0) | (values >= limits[head])]
        return (
            f"{where}{head_label}: index {int(bad[0])} out of range; allowed are 0 <= index < "
            f"{int(limits[head])} (the rows this head holds)"
        )
    step = np.diff(values.astype(np.int64))
    at = int(np.nonzero(step == 0)[0][0] if kind == 1 else np.nonzero(step < 0)[0][0])
    if kind == 1:
        return f"{where}{head_label}: index {int(values[at])} is duplicated; indices must be unique"
    return (
        f"{where}{head_label}: indices are not sorted ({int(values[at])} before {int(values[at + 1])}); "
        "pass them in increasing order"
    )
