"""The cache timeline of a decode (issue 40): at each compression, which positions each (layer, kv-head) held and
whether it kept them — the table behind `kvlens compress … --timeline FILE.csv`.

A compression at step s saw what the previous one kept (or the state's positions, for the first) plus the tokens
appended since, at positions n_start + previous step … n_start + s − 1; one row per such (step, layer, kv_head,
position), kept 1 or 0. Positions a layer stored whole (sliding window, SSM state) have no rows.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from typing import Any, BinaryIO

from kvcore.atomic import write_stream

TIMELINE_COLUMNS = ("step", "layer", "kv_head", "position", "kept")

__all__ = ["TIMELINE_COLUMNS", "held_before", "timeline_rows", "write_timeline"]


def held_before(run: Any) -> Iterator[tuple[Any, list[list[list[int]] | None]]]:
    """(compression, what each (layer, kv-head) held just before it), in order."""
    held, last_step = run.start_kept, 0
    for c in run.compressions:
        new = list(range(run.n_start + last_step, run.n_start + c.step))
        before = [None if layer is None else [p + new for p in layer] for layer in held]
        yield c, before
        held, last_step = c.kept, c.step


def timeline_rows(run: Any) -> Iterator[tuple[int, int, int, int, int]]:
    """(step, layer, kv_head, position, kept) for every position held at each compression, in position order."""
    for c, before in held_before(run):
        for layer, (heads, kept_heads) in enumerate(zip(before, c.kept, strict=True)):
            if heads is None or kept_heads is None:
                continue
            for h, (positions, kept) in enumerate(zip(heads, kept_heads, strict=True)):
                keep = set(kept)
                for p in positions:
                    yield c.step, layer, h, p, int(p in keep)


def write_timeline(path: Any, run: Any) -> None:
    """Write the timeline CSV atomically (streamed: a 1,024-token decode of a 28-layer model is millions of rows)."""

    def write(out: BinaryIO) -> None:
        text = io.TextIOWrapper(out, encoding="utf-8", newline="")
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(TIMELINE_COLUMNS)
        writer.writerows(timeline_rows(run))
        text.flush()
        text.detach()

    write_stream(path, write)
