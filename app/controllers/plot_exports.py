"""Save any plot of the window as PNG or SVG, and table rows as CSV: one save dialog and one message path.

A plot is anything with `export_image(path)` (PNG or SVG by suffix, atomic); failures become a message in the
window, never an exception, and nothing is written for an empty plot.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from PySide6.QtWidgets import QInputDialog, QWidget

from app.controllers.file_dialogs import IMAGES, save_path
from app.controllers.host import Host
from app.settings import Settings
from app.widgets.plot_export import DEFAULT_EXPORT_WIDTH, IMAGE_FILTER, with_image_suffix
from kvcore.measure import export


class Exportable(Protocol):
    def export_image(self, path: str | os.PathLike[str], width: int | None = None) -> None: ...


def export_plot(
    host: Host, plot: Exportable, path: str | Path, what: str, empty: bool, width: int | None = None
) -> bool:
    """Write `plot` to `path` (a PNG `width` pixels wide); a message naming `what` instead of an exception."""
    if empty:
        host.error("Nothing to export", f"Prefill a prompt first: the {what} is empty.")
        return False
    try:
        plot.export_image(path, width)
    except (OSError, ValueError) as exc:
        host.error("Export failed", f"Could not write {path}: {getattr(exc, 'strerror', None) or exc}")
        return False
    host.status.show(f"Exported the {what} to {path}")
    return True


def ask_image_path(
    parent: QWidget, what: str, default_stem: str, settings: Settings
) -> tuple[str, int | None] | None:
    """A save dialog for PNG or SVG in the last image folder (the chosen filter's suffix added when the name has
    none), then, for a PNG, its width in pixels; None when the user cancels either."""
    path, chosen = save_path(parent, settings, IMAGES, f"Export {what}", f"{default_stem}.png", IMAGE_FILTER)
    if not path:
        return None
    path = with_image_suffix(path, chosen)
    if not path.lower().endswith(".png"):
        return path, None
    width, ok = QInputDialog.getInt(
        parent,
        f"Export {what}",
        "Width in pixels (labels scale with it):",
        DEFAULT_EXPORT_WIDTH,
        200,
        20000,
        100,
    )
    return (path, width) if ok else None


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
