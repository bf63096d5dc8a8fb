"""The CLI's one progress line on stderr: a 30-wide bar redrawn in place."""

from __future__ import annotations

import sys

BAR_WIDTH = 30
_state = {"open": False}  # a bar is drawn and its line not ended: an error message must start a new line


def draw_progress(done: int, total: int, label: str) -> None:
    """Redraw `[###...] done/total label` over the previous line (a total of 0 draws a full bar)."""
    filled = int(BAR_WIDTH * done / total) if total else BAR_WIDTH
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} {label}  ")
    sys.stderr.flush()
    _state["open"] = True


def end_progress(only_if_drawn: bool = False) -> None:
    """End the progress line (always, or `only_if_drawn`: when a bar is on it, before an error message)."""
    if _state["open"] or not only_if_drawn:
        sys.stderr.write("\n")
    _state["open"] = False
