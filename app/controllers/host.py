"""What a controller may ask of the window, as a protocol: controllers never import the window (app layers
import only downward) and never reach into its private state or each other's.

MainWindow implements it. A controller gets its own widgets and the controllers it works with in its
constructor; the host gives what the whole window shares.
"""

from __future__ import annotations

from typing import Any, Protocol

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDockWidget, QMainWindow

from app.engine.thread import EngineThread
from app.engine.view_model import CompressionView, LoadedModel
from app.settings import Settings
from app.widgets.controls import CompressionControls
from app.widgets.heatmap import RetentionHeatmap
from app.widgets.session_panel import SessionPanel
from app.widgets.stats_table import StatsTable
from app.widgets.status_area import StatusArea
from kvcore.model.loading import ModelInfo

#: A run dock (Sweep, Needle grid) shown for its results takes at least this share of the window's height (from
#: the heatmap above it).
RUN_DOCK_SHARE = 0.45


def show_run_dock(window: QMainWindow, dock: QDockWidget) -> None:
    """Show and raise `dock`, taller if needed: its plot is what the user came for (the heatmap gives way)."""
    dock.show()
    dock.raise_()
    if dock.isFloating():
        return
    tall = int(window.height() * RUN_DOCK_SHARE)
    if dock.height() < tall:
        window.resizeDocks([dock], [tall], Qt.Orientation.Vertical)


def baseline_dtype(host: Host) -> str | None:
    """The loaded model's dense cache element type ('float32' on MLX's CPU, 'bfloat16' on a Mac): what a label says
    for an unquantized side. None before a model is loaded."""
    info = host.model_info
    return (info.cache_dtype or None) if info is not None else None


class Host(Protocol):
    """The window as its controllers see it."""

    engine: EngineThread
    status: StatusArea
    settings: Settings
    controls: CompressionControls
    sessionPanel: SessionPanel  # noqa: N815 (the window's widget names are Qt-style)
    heatmap: RetentionHeatmap
    statsTable: StatsTable  # noqa: N815
    model_info: ModelInfo | None
    #: A prefill was asked for and stands (a failed one restores the previous state): what Generate,
    #: a recompress, a sweep and Save need.
    prefilled: bool

    @property
    def widget(self) -> QMainWindow:
        """The window as a Qt parent: dialogs, actions and toolbars hang on it."""
        ...

    def error(self, title: str, message: str) -> None:
        """Tell the user what went wrong and how to fix it (status bar and a message box)."""
        ...

    def prefill(self, prompt: str | None = None) -> int | None: ...

    def request_compression(self, *_: Any, regenerate: bool | None = None) -> int | None: ...

    def show_loaded(self, loaded: LoadedModel) -> None:
        """Show a model that is now the engine's (a load, or a session file that brought its model)."""
        ...

    def show_compression(self, view: CompressionView) -> None:
        """Draw a compression result everywhere it shows (heatmap, table, metrics, continuations)."""
        ...

    def rebuild_recent_menus(self) -> None:
        """Refill the File menu's recent models, sessions and results from the settings."""
        ...
