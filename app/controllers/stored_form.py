"""The Stored form dock's exports: each view's Image… button asks for a PNG or SVG path and writes the view there
(app.controllers.plot_exports), or says that there is nothing to export."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.controllers.host import Host
from app.controllers.plot_exports import ask_image_path, export_plot
from app.widgets.stored_form import StoredFormPanel


class StoredFormController:
    """Wires the two views' export buttons to the window's save dialog and messages."""

    def __init__(self, host: Host, panel: StoredFormPanel) -> None:
        self.host, self.panel = host, panel
        panel.channelMap.exportImageButton.clicked.connect(
            lambda: self._dialog("key-channel map", "kvlens_key_channels", self.export_channels)
        )
        panel.mergeMap.exportImageButton.clicked.connect(
            lambda: self._dialog("merges view", "kvlens_merges", self.export_merges)
        )

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
