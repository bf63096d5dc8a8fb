"""Save any plot of the window as PNG or SVG, and table rows as CSV: one save dialog and one message path.

A plot is anything with `export_image(path)` (PNG or SVG by suffix, atomic); failures become a message in the
window, never an exception, and nothing is written for an empty plot.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from PySide6.QtWidgets import QFileDialog, QWidget

from app.controllers.host import Host
from app.widgets.plot_export import IMAGE_FILTER, with_image_suffix
from kvcore.measure import export


class Exportable(Protocol):
    def export_image(self, path: str | os.PathLike[str]) -> None: ...


def export_plot(host: Host, plot: Exportable, path: str | Path, what: str, empty: bool) -> bool:
    """Write `plot` to `path`; a message naming `what` instead of an exception when that fails."""
    if empty:
        host.error("Nothing to export", f"Prefill a prompt first: the {what} is empty.")
        return False
    try:
        plot.export_image(path)
    except (OSError, ValueError) as exc:
        host.error("Export failed", f"Could not write {path}: {getattr(exc, 'strerror', None) or exc}")
        return False
    host.status.show(f"Exported the {what} to {path}")
    return True


def ask_image_path(parent: QWidget, what: str, default_stem: str) -> str | None:
    """A save dialog for PNG or SVG; the chosen filter's suffix is added when the name has none."""
    path, chosen = QFileDialog.getSaveFileName(parent, f"Export {what}", f"{default_stem}.png", IMAGE_FILTER)
    return with_image_suffix(path, chosen) if path else None


def export_rows(host: Host, path: str | Path, rows: list[dict], columns: Sequence[str], empty: str) -> bool:
    """Write `rows` as CSV; the `empty` message when there are none, a message instead of an exception on failure."""
    if not rows:
        host.error("Nothing to export", empty)
        return False
    try:
        export.write_csv(path, rows, columns)
    except OSError as exc:
        host.error("Export failed", f"Could not write {path}: {exc.strerror or exc}")
        return False
    return True
