"""`kvcore.cache.sparse.select_positions` as it was before issue 15 (per-layer device index work), kept as the baseline.

Used only by `benchmarks.bench_select_batched` (old vs new, side by side) and by the test that the batched path
builds bit-identical caches. Per layer it copies the indices to the device, checks them there (~6 MLX ops), clips
them, builds the flat index and the positions on the device, then gathers; one `mx.eval` at the end and one
read-back of every layer's flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvcore.cache import index_checks
from kvcore.cache.sparse import (
    _arrays,
    _empty_like,
    _SparseRows,
    incompressible_reason,
)
from kvcore.cache.sparse import _Source as _HostSource

# isort: split
import mlx.core as mx
import numpy as np


class _Source(_HostSource):
    def cols(self, rows: mx.array) -> mx.array:
        if not self.ragged:
            return rows
        prefix = mx.array(self.layer._prefix_counts)[:, None]
        return mx.where(rows < prefix, rows, rows - prefix + self.layer.n_prefix)

    def positions(self, cols: mx.array) -> mx.array:
        if not isinstance(self.layer, _SparseRows):
            return cols
        layer = self.layer
        tail = mx.arange(layer.offset - layer.n_appended, layer.offset, dtype=mx.int32)
        by_col = mx.concatenate(
            [layer._selection, mx.broadcast_to(tail[None], (self.n_heads, layer.n_appended))], axis=1
        )
        return mx.take_along_axis(by_col, cols, axis=1)


def _gather(buf: mx.array, cols: mx.array) -> mx.array:
    b, h, cap, d = buf.shape
    n = cols.shape[1]
    flat = (cols + (mx.arange(h, dtype=mx.int32) * cap)[:, None]).reshape(-1)
    return mx.take(buf.reshape(b, h * cap, d), flat, axis=1).reshape(b, h, n, d)


def _check_flags(padded: mx.array, counts: np.ndarray, rows_per_head: np.ndarray) -> mx.array:
    if padded.ndim == 1:
        padded = padded[None]
    h, n = len(counts), padded.shape[1]
    valid = mx.array(np.arange(n)[None, :] < counts[:, None])
    if padded.shape[0] != h:
        padded = mx.broadcast_to(padded, (h, n))
    limit = mx.array(rows_per_head.astype(np.int32))[:, None]
    out_of_range = mx.any(valid & ((padded < 0) | (padded >= limit)), axis=1)
    step = padded[:, 1:] - padded[:, :-1]
    pairs = valid[:, 1:]
    return mx.stack([out_of_range, mx.any(pairs & (step == 0), axis=1), mx.any(pairs & (step < 0), axis=1)])


def select_positions(
    cache: Sequence[Any],
    indices_per_layer: Sequence[Any],
    logical_offset: int | None = None,
    validate: bool = True,
) -> list:
    out: list[Any] = list(cache)
    plans = []
    for i, (layer, idx) in enumerate(zip(cache, indices_per_layer, strict=True)):
        if idx is None:
            continue
        assert incompressible_reason(layer) is None
        src = _Source(layer)
        host, counts, shared = index_checks.host_indices(idx, src.n_heads, f"layer {i}")
        padded = mx.array(host)
        flags = _check_flags(padded, counts, src.rows_per_head) if validate else None
        rows = padded if not shared else mx.broadcast_to(padded[None], (src.n_heads, padded.shape[0]))
        if validate:
            rows = mx.clip(rows, 0, mx.array(np.maximum(src.rows_per_head - 1, 0).astype(np.int32))[:, None])
        cols = src.cols(rows)
        k = [_gather(b, cols) for b in src.k_parts]
        v = [_gather(b, cols) for b in src.v_parts]
        selection = src.positions(cols)
        new = _empty_like(layer)
        offset = layer.offset if logical_offset is None else int(logical_offset)
        new._set_rows(new._wrap(k), new._wrap(v), selection, counts, offset)
        out[i] = new
        plans.append((flags, new))
    mx.eval([f for f, _ in plans if f is not None] + [a for _, n in plans for a in _arrays(n)])
    for flags, _ in plans:
        if flags is not None and np.asarray(flags).any():
            raise ValueError("invalid indices")
    return out
