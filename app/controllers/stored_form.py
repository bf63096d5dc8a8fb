"""The Stored form dock: each compression's stored form shown, the dock brought to the front when the method starts
changing what is stored (a user who picks think sees its channels), and each view's Image… button, which asks for a
PNG or SVG path and writes the view there (app.controllers.plot_exports) or says there is nothing to export."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QDockWidget

from app.controllers.host import Host
from app.controllers.plot_exports import ask_image_path, export_plot
from app.engine.view_model import CompressionView
from app.widgets.stored_form import StoredFormPanel


class StoredFormController:
    """Feeds the dock each compression and wires the two views' export buttons to the window's dialogs."""

    def __init__(self, host: Host, panel: StoredFormPanel, dock: QDockWidget) -> None:
        self.host, self.panel, self.dock = host, panel, dock
        self._changed = False  # whether the last compression shown changed the stored form
        panel.channelMap.exportImageButton.clicked.connect(
            lambda: self._dialog("key-channel map", "kvlens_key_channels", self.export_channels)
        )
        panel.mergeMap.exportImageButton.clicked.connect(
            lambda: self._dialog("merges view", "kvlens_merges", self.export_merges)
        )

    def show(self, view: CompressionView) -> None:
        """Show `view`'s stored form; the dock comes to the front when its method is the first in a row to change
        what is stored (a slider move with the same method leaves the bottom row as the user set it)."""
        self.panel.set_compression(view)
        changed = view.key_channels is not None or view.merge_targets is not None
        if changed and not self._changed:
            self.dock.show()
            self.dock.raise_()
        self._changed = changed

    def clear(self) -> None:
        self.panel.clear()
        self._changed = False

    def export_channels(self, path: str | Path, width: int | None = None) -> bool:
        """Write the key-channel map; a message instead when no method pruned channels."""
        view = self.panel.channelMap
        return export_plot(self.host, view, path, "key-channel map", view.view() is None, width)

    def export_merges(self, path: str | Path, width: int | None = None) -> bool:
        """Write the shown layer's merges; a message instead when nothing was merged."""
        view = self.panel.mergeMap
        return export_plot(self.host, view, path, "merges view", not view.has_data(), width)

    def _dialog(self, what: str, stem: str, export: Callable[[str, int | None], bool]) -> None:
        chosen = ask_image_path(self.host.widget, what, stem, self.host.settings)
        if chosen:
            export(*chosen)
