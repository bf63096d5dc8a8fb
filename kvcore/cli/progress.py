"""The CLI's one progress line on stderr: a 30-wide bar redrawn in place."""

from __future__ import annotations

import sys

BAR_WIDTH = 30


def draw_progress(done: int, total: int, label: str) -> None:
    """Redraw `[###...] done/total label` over the previous line (a total of 0 draws a full bar)."""
    filled = int(BAR_WIDTH * done / total) if total else BAR_WIDTH
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} {label}  ")
    sys.stderr.flush()
