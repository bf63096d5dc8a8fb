"""File dialogs that open where the same kind of file was last chosen (Settings.last_folders), one folder per kind:
exports of statistics go back to the statistics folder, models to the models folder."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from app.settings import Settings

#: The kinds of dialog that keep their own folder.
STATS, IMAGES, MODELS, RESULTS, SWEEPS, PROBES, SESSIONS = (
    "stats",
    "images",
    "models",
    "results",
    "sweeps",
    "probes",
    "sessions",
)


def _start(settings: Settings, kind: str, name: str = "") -> str:
    folder = settings.folder_for(kind)
    return str(Path(folder) / name) if folder else name


def save_path(
    parent: QWidget, settings: Settings, kind: str, title: str, name: str, filters: str
) -> tuple[str, str]:
    """(path, chosen filter) from a save dialog that starts in `kind`'s folder; ("", "") when cancelled."""
    path, chosen = QFileDialog.getSaveFileName(parent, title, _start(settings, kind, name), filters)
    if path:
        settings.remember_folder(kind, path)
    return path, chosen


def open_path(parent: QWidget, settings: Settings, kind: str, title: str, filters: str) -> str:
    """A file chosen in an open dialog that starts in `kind`'s folder; "" when cancelled."""
    path, _ = QFileDialog.getOpenFileName(parent, title, _start(settings, kind), filters)
    if path:
        settings.remember_folder(kind, path)
    return path


def open_folder(parent: QWidget, settings: Settings, kind: str, title: str) -> str:
    """A folder chosen in a dialog that starts in `kind`'s last folder's parent; "" when cancelled."""
    last = settings.folder_for(kind)
    folder = QFileDialog.getExistingDirectory(parent, title, str(Path(last).parent) if last else "")
    if folder:
        settings.remember_folder(kind, folder)
    return folder
