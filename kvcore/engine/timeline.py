"""The cache timeline of a decoding run (issue 40): which positions every (layer, kv-head) holds at every step.

A `DecodingRun` records the kept positions only where a policy evicted; the timeline fills in the rest. Step k
is the cache after k tokens were appended *and* after that step's eviction, if any (step 0: when decoding
began, after an eviction of a cache already above the budget), so scrubbing to a compression step shows exactly
what it kept. Position p is written at step 0 (the cache decoding started from: the schedule's compressible
prompt, `n_start` positions) or at step p − n_start + 1 (the token appended then).

Everything is stored as one number per (layer, kv-head, position): the step it left the cache (`NEVER` when it
was held to the end). Held at step k ⟺ written_at[p] ≤ k < evicted_at[…, p]. That is O(L·H·P), where a mask per
step would be O(steps·L·H·P) — 8,192 steps of a 32-layer model would not fit.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcore.atomic import write_text
from kvcore.engine.decoding import DecodingRun

#: evicted_at of a position still held when decoding ended.
NEVER = -1
#: Cells of one block of share_held's difference array (int64): 32 MB.
_BLOCK_CELLS = 1 << 22
#: The CSV's columns: from `step` on, (layer, kv_head) holds position (kept 1) or no longer holds it (kept 0).
TIMELINE_COLUMNS = ("step", "layer", "kv_head", "position", "kept")

__all__ = ["NEVER", "TIMELINE_COLUMNS", "Timeline", "held_before", "of_run", "timeline", "write_timeline_csv"]


@dataclass(frozen=True)
class Timeline:
    """When every position entered and left the cache of every (layer, kv-head); see the module docstring."""

    n_start: int  # positions the cache held room for when decoding began
    n_steps: int  # tokens appended (decode steps)
    evicted_at: np.ndarray  # [L, H_kv, P] int32: the step the position left the cache, NEVER if it stayed
    start_held: np.ndarray  # [L, H_kv, n_start] bool: what the prefill compression left (before step 0)
    whole_layers: tuple[int, ...]  # layers stored whole (no policy evicts from them): held throughout

    @property
    def n_positions(self) -> int:
        """Positions ever written: the start cache's, then one per step."""
        return self.evicted_at.shape[2]

    @property
    def written_at(self) -> np.ndarray:
        """[P] int: the step each position was written at (0 for the start cache)."""
        return np.concatenate(
            [np.zeros(self.n_start, np.int64), np.arange(1, self.n_positions - self.n_start + 1)]
        )

    def held(self, step: int) -> np.ndarray:
        """[L, H_kv, P] bool: the positions each (layer, kv-head) holds at `step` (unwritten ones: False)."""
        self._check_step(step)
        ev = self.evicted_at
        return (self.written_at <= step)[None, None, :] & ((ev > step) | (ev == NEVER))

    def head_history(self, layer: int, kv_head: int, steps: np.ndarray | None = None) -> np.ndarray:
        """[steps, P] bool: row i = the positions (layer, kv_head) holds at steps[i] (default: every step)."""
        steps = self._steps(steps)[:, None]
        ev = self.evicted_at[layer, kv_head][None, :]
        return (self.written_at[None, :] <= steps) & ((ev > steps) | (ev == NEVER))

    def share_at(self, step: int) -> np.ndarray:
        """[P] float32: the share of the compressible layers' kv-heads holding each position at `step`."""
        layers = self._compressible()
        if not layers:
            return np.zeros(self.n_positions, np.float32)
        return self.held(step)[layers].reshape(-1, self.n_positions).mean(axis=0, dtype=np.float32)

    def share_held(self, steps: np.ndarray | None = None) -> np.ndarray:
        """[steps, P] float32: `share_at` at each of `steps` (default: every step), 0 where nothing is written.

        From a difference array, +1 where a head starts holding a position and −1 where it stops, summed down the
        steps: O(steps·P + L·H·P) rather than O(steps·L·H·P), in blocks of columns so 8,192 steps of a long
        prompt stay within a few MB at a time."""
        steps = self._steps(steps)
        layers, n_pos = self._compressible(), self.n_positions
        out = np.zeros((len(steps), n_pos), np.float32)
        if not layers or n_pos == 0:
            return out
        ev = self.evicted_at[layers].reshape(-1, n_pos).astype(np.int64)
        ev = np.where(ev == NEVER, self.n_steps + 1, ev)
        written, n_rows = self.written_at, self.n_steps + 2
        block = max(1, _BLOCK_CELLS // n_rows)
        for lo in range(0, n_pos, block):
            hi = min(n_pos, lo + block)
            end = ev[:, lo:hi]
            begin = np.broadcast_to(written[None, lo:hi], end.shape)
            live = end > begin
            cols = np.broadcast_to(np.arange(hi - lo)[None, :], end.shape)[live]
            size = n_rows * (hi - lo)
            delta = np.bincount(begin[live] * (hi - lo) + cols, minlength=size) - np.bincount(
                end[live] * (hi - lo) + cols, minlength=size
            )
            counts = np.cumsum(delta.reshape(n_rows, hi - lo), axis=0)
            out[:, lo:hi] = counts[steps] / ev.shape[0]
        return out

    def _compressible(self) -> list[int]:
        return [i for i in range(self.evicted_at.shape[0]) if i not in self.whole_layers]

    def _steps(self, steps: np.ndarray | None) -> np.ndarray:
        if steps is None:
            return np.arange(self.n_steps + 1)
        steps = np.asarray(steps, dtype=np.int64)
        if steps.size and (steps.min() < 0 or steps.max() > self.n_steps):
            raise ValueError(f"steps run from 0 to {self.n_steps}, got {steps.min()} … {steps.max()}")
        return steps

    def rows(self) -> list[tuple[int, int, int, int, int]]:
        """CSV rows (step, layer, kv_head, position, kept), sorted: kept 1 from the step a position is held on
        (its write, or 0), kept 0 from the step it left; so the state at step k of a (layer, kv_head, position)
        is its last row at or before k, and the file stays O(L·H·P) however many steps ran."""
        return [tuple(int(v) for v in r) for r in self._row_array()]

    def _row_array(self) -> np.ndarray:
        n_layers, n_heads, n_pos = self.evicted_at.shape
        layer, head, pos = (a.ravel() for a in np.indices(self.evicted_at.shape))
        ev = self.evicted_at.ravel().astype(np.int64)
        written = np.tile(self.written_at, n_layers * n_heads)
        entered = (ev == NEVER) | (ev > written)
        left = ev != NEVER
        out = np.concatenate(
            [
                np.stack([written, layer, head, pos, np.ones_like(pos)], axis=1)[entered],
                np.stack([ev, layer, head, pos, np.zeros_like(pos)], axis=1)[left],
            ]
        )
        return out[np.lexsort((out[:, 3], out[:, 2], out[:, 1], out[:, 0]))]

    def _check_step(self, step: int) -> None:
        if not 0 <= step <= self.n_steps:
            raise ValueError(f"step {step} is outside the run: give 0 … {self.n_steps}")


def timeline(
    run: DecodingRun, n_start: int, start_kept: Sequence[Sequence[Sequence[int]] | None]
) -> Timeline:
    """The timeline of `run`, which started from a cache of `n_start` positions whose (layer, kv-head) held
    `start_kept[layer][kv_head]` (None for a layer stored whole: a sliding window, an SSM state).

    Raises ValueError when the run keeps a position its cache could not hold (not written yet, or evicted
    before): the run and the start do not belong together."""
    if n_start < 0:
        raise ValueError(f"n_start must be at least 0, got {n_start}")
    n_layers = len(start_kept)
    heads = {len(h) for h in start_kept if h is not None}
    heads |= {len(h) for c in run.compressions for h in c.kept if h is not None}
    if len(heads) > 1:
        raise ValueError(f"the run and its start disagree on the kv-heads per layer: {sorted(heads)}")
    n_heads = heads.pop() if heads else 1
    n_steps = len(run.steps)
    evicted = np.full((n_layers, n_heads, n_start + n_steps), NEVER, np.int32)
    start_held = np.ones((n_layers, n_heads, n_start), bool)
    whole = tuple(i for i, h in enumerate(start_kept) if h is None)
    for layer, per_head in enumerate(start_kept):
        if per_head is None:
            continue
        mask = _mask(per_head, n_heads, n_start, f"start_kept[{layer}]")
        start_held[layer] = mask
        evicted[layer, :, :n_start][~mask] = 0
    for c in run.compressions:
        if len(c.kept) != n_layers:
            raise ValueError(
                f"the compression at step {c.step} has {len(c.kept)} layers, the start {n_layers}"
            )
        if c.step > n_steps:
            raise ValueError(f"a compression at step {c.step} of a run of {n_steps} steps")
        written = n_start + c.step
        for layer, per_head in enumerate(c.kept):
            if per_head is None or layer in whole:
                continue
            mask = _mask(per_head, n_heads, written, f"the compression at step {c.step}, layer {layer}")
            held = evicted[layer, :, :written] == NEVER
            if (mask & ~held).any():
                h, p = np.argwhere(mask & ~held)[0]
                raise ValueError(
                    f"the compression at step {c.step} keeps position {p} of layer {layer}, kv-head {h}, which "
                    "had left the cache: the run does not start from this cache"
                )
            evicted[layer, :, :written][held & ~mask] = c.step
    return Timeline(n_start, n_steps, evicted, start_held, whole)


def _mask(per_head: Sequence[Sequence[int]], n_heads: int, width: int, what: str) -> np.ndarray:
    """[n_heads, width] bool of per-head position lists; ValueError naming `what` for a position out of range."""
    if len(per_head) != n_heads:
        raise ValueError(f"{what} has {len(per_head)} kv-heads, expected {n_heads}")
    mask = np.zeros((n_heads, width), bool)
    for h, positions in enumerate(per_head):
        pos = np.asarray(positions, dtype=np.int64)
        if pos.size and (pos.min() < 0 or pos.max() >= width):
            raise ValueError(
                f"{what} keeps position {int(pos.max())} of kv-head {h}: only {width} were written"
            )
        mask[h, pos] = True
    return mask


def write_timeline_csv(path: str | os.PathLike, tl: Timeline) -> int:
    """Write `tl.rows()` with a TIMELINE_COLUMNS header to `path`, atomically; returns the number of rows."""
    rows = tl._row_array()
    buffer = io.StringIO()
    buffer.write(",".join(TIMELINE_COLUMNS) + "\n")
    np.savetxt(buffer, rows, fmt="%d", delimiter=",")
    write_text(path, buffer.getvalue())
    return len(rows)


def of_run(run: DecodingRun) -> Timeline:
    """The timeline of a run that recorded its own start (`decode_with_policy` sets n_start and start_kept)."""
    return timeline(run, run.n_start, run.start_kept)


def held_before(run: Any) -> Iterator[tuple[Any, list[list[np.ndarray]] | None]]:
    """(compression, what each (layer, kv-head) held just before it, int32 arrays), in order: what the previous
    compression kept (or the start) plus the tokens appended since."""
    held, last_step = run.start_kept, 0
    for c in run.compressions:
        new = np.arange(run.n_start + last_step, run.n_start + c.step, dtype=np.int32)
        before = [
            None if layer is None else [np.concatenate([np.asarray(p, np.int32), new]) for p in layer]
            for layer in held
        ]
        yield c, before
        held, last_step = c.kept, c.step
